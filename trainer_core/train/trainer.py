"""The training loop: steps, logging, evaluation and checkpoints at step boundaries.

The loop is the same in a single process, under ``torchrun`` and inside a Ray Train worker; what
differs is injected: where batches come from (``train_batches(start_step)``) and extra callbacks.
A step is one optimizer update; ``step`` counts updates done, so a checkpoint at step N resumes
with update N + 1 and the batch for step N (0-based index of the next batch).
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from trainer_core.checkpoint.checkpointer import Checkpointer
from trainer_core.checkpoint.keep import CheckpointPolicy
from trainer_core.checkpoint.listing import (
    CheckpointError,
    branch_step,
    interruption_line,
)
from trainer_core.checkpoint.rng import restore_rng, rng_state
from trainer_core.config.loader import ConfigError, to_yaml
from trainer_core.config.sections import TrainConfig
from trainer_core.data.shards import DataError
from trainer_core.errors import UserError, exception_chain
from trainer_core.io import storage
from trainer_core.io.run_dir import (
    RunInfo,
    WorkerGroup,
    config_path,
    worker_groups,
    write_run_json,
)
from trainer_core.io.storage import write_atomic
from trainer_core.parallel.process_group import all_gather_object, collective_device
from trainer_core.train.callbacks import Callback
from trainer_core.train.same_run import check_same_data, check_same_run
from trainer_core.train.schedule import annealed_steps
from trainer_core.train.train_module import BatchStats, TrainModule

if TYPE_CHECKING:
    from trainer_core.train.task_eval import TaskEvaluator

log = logging.getLogger(__name__)

_WINDOW_KEY = "log_window"
"""The log window's key in a rank's section of a checkpoint."""


class NonFiniteLossError(UserError, RuntimeError):
    """Raised (on every rank) when the loss or gradient norm is NaN/inf; names which, and the step.

    Every rank agrees: the gradient norm is global, and a non-finite loss on any rank makes it
    non-finite too. The loss shown is this rank's mean over its tokens.
    """

    def __init__(self, step: int, loss: float, grad_norm: float):
        self.step = step
        what = "gradient norm" if math.isfinite(loss) else "loss"
        super().__init__(
            f"non-finite {what} at step {step} (loss={loss:.4g}, grad_norm={grad_norm:.4g}); the "
            "run stopped and no checkpoint was written after it. Lower "
            "optim.lr, raise schedule.warmup or set train_module.max_grad_norm."
        )


@dataclass
class _Window:
    """Sums since the last log line, kept on the device so a step never waits for it (read on
    log steps only). Eval, task-eval and checkpoint seconds are kept apart so the step
    throughput (tokens/s, MFU) measures training alone.

    ``sums``: this rank's CE, z-loss and tokens, and the global gradient norms, summed.
    ``first_bad``: the first step whose loss or gradient norm was non-finite (0: none yet), with
    its loss sum, tokens and norm, for the error the next check raises.
    ``carried``: of ``steps``, those a checkpoint brought (a resume between log steps): in the
    averages, so the line is the uninterrupted run's, but not in this window's seconds.
    """

    sums: torch.Tensor
    first_bad: torch.Tensor
    start_time: float
    steps: int = 0
    carried: int = 0
    eval_s: float = 0.0
    task_eval_s: float = 0.0
    checkpoint_s: float = 0.0

    @classmethod
    def on(cls, device: torch.device, start_time: float) -> _Window:
        zeros = torch.zeros(4, dtype=torch.float64, device=device)
        return cls(sums=zeros, first_bad=zeros.clone(), start_time=start_time)

    def state(self, layout: list[int]) -> dict[str, Any]:
        """This rank's sums for its checkpoint (``first_bad`` is zero there: a save checks it
        first). ``layout``: the world and DP sizes, which the sums are per rank of."""
        return {"sums": self.sums, "steps": self.steps, "layout": layout}

    def resume(self, saved: dict[str, Any] | None, layout: list[int]) -> None:
        """Carry a checkpoint's sums on. Without them (a checkpoint from before they were
        saved) or from another layout (whose ranks summed other shares), the window starts at
        the resume step: its first line then averages the steps since."""
        if saved is None or list(saved["layout"]) != layout:
            return
        self.sums = saved["sums"].to(self.sums)
        self.steps = self.carried = int(saved["steps"])

    def add(self, step: int, stats: BatchStats, norm: torch.Tensor) -> None:
        """Device ops only: no host sync."""
        values = torch.stack(
            [stats.ce_sum, stats.z_sum, stats.num_tokens, norm.to(stats.ce_sum.device)]
        ).double()
        self.sums += values
        bad = ~(torch.isfinite(stats.ce_sum) & torch.isfinite(norm))
        first = bad & (self.first_bad[0] == 0)
        # slices, not values[[0, 2, 3]]: a list index is a tensor made from host data, which on
        # CUDA is a blocking copy every step
        record = torch.cat([values.new_full((1,), float(step)), values[0:1], values[2:4]])
        self.first_bad = torch.where(first, record, self.first_bad)
        self.steps += 1


class Trainer:
    """The loop around a :class:`TrainModule`: steps, logging, evals and checkpoints.

    It owns what happens *between* optimizer steps and knows nothing of how a step is computed
    (the train module) or where batches come from (``train_batches(start_step)``, so a resumed
    run asks for the batches from its checkpoint's step on). Callbacks see every boundary; Ray
    adds its reporting as one of them, so the loop is the same with and without Ray.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        module: TrainModule,
        *,
        train_batches: Callable[[int], Iterator[torch.Tensor]],
        eval_batches: list[torch.Tensor],
        info: RunInfo,
        rank: int = 0,
        world_size: int = 1,
        peak_flops: float = 1.0,
        peak_measured: bool = False,
        callbacks: list[Callback] | None = None,
        placement: dict[str, str] | None = None,
        task_evaluator: TaskEvaluator | None = None,
    ):
        """``placement``: where this rank runs as its launcher knows it (the Ray worker passes
        its node id), recorded in run.json beside the host name. ``task_evaluator``: the
        downstream tasks scored at every eval, beside the held-out loss. ``peak_measured``:
        ``peak_flops`` is a CPU's matmul speed, measured once a process (a reused Tune trial's
        process: at its first run), which a neighbour's load then can have lowered; a window
        that outruns it raises it for this run (MFU stays <= 100%)."""
        self.cfg, self.module, self.info = cfg, module, info
        self.placement = placement or {}
        self.workers: list[WorkerGroup] = []
        self.train_batches, self.eval_batches_data = train_batches, eval_batches
        self.rank, self.world_size, self.peak_flops = rank, world_size, peak_flops
        self.peak_measured = peak_measured
        self.callbacks = callbacks or []
        self.task_evaluator = task_evaluator
        self.run_dir = cfg.trainer.run_location
        self.step = 0
        self.tokens = 0
        self.last_metrics: dict[str, float] = {}
        self.window = _Window.on(module.device, start_time=0.0)
        """The log window: the loop adds to it, a checkpoint saves it, a resume carries it on
        (the loop starts its clock)."""
        self.annealed_steps = annealed_steps(info.total_steps, cfg.schedule)
        ckpt = cfg.checkpoint
        self.checkpointer = (
            Checkpointer(self.run_dir, ckpt, rank=rank, world_size=world_size)
            if ckpt.enabled
            else None
        )
        self.policy = CheckpointPolicy(ckpt) if ckpt.enabled else None
        self.clock: Callable[[], float] = time.perf_counter
        """Seconds for the throughput window and the eval and checkpoint time it leaves out;
        a test swaps in a fake one to check that arithmetic without timing real work."""

    # -- state --------------------------------------------------------------------------------

    def app_state(self) -> dict[str, Any]:
        """What a checkpoint holds. The log window's sums differ by rank, so they go in the
        checkpoint's per-rank section beside the RNG states, which loads what it holds: a
        checkpoint saved without them still loads."""
        per_rank = rng_state(self.rank, self.module.device)
        per_rank[f"rank{self.rank}"][_WINDOW_KEY] = self.window.state(self._layout)
        return {
            "train_module": self.module,
            "trainer": {"step": self.step, "tokens": self.tokens},
            "rng": per_rank,
        }

    @property
    def _layout(self) -> list[int]:
        return [self.world_size, self.module.dp_size]

    def restore(self) -> int:
        """Load the latest complete checkpoint of the run that verifies (see
        :meth:`Checkpointer.load_latest`); a run with none yet starts from
        ``checkpoint.resume_from`` (exactly that one) when set.

        So a run branched from another's checkpoint resumes, after a failure, from its own
        progress, not from the branch point again (:func:`trainer_core.ray.reader.resume_step`
        follows the same rule for the data). Resuming its own checkpoints, the run must be on
        the data it started on (:func:`check_same_data`; a branch may change it)."""
        if self.checkpointer is None:
            return 0
        state = self.app_state()
        resume_from = self.cfg.checkpoint.resume_from
        own = self.checkpointer.complete()
        if own:
            check_same_data(self.info.data_id, self.run_dir)
            if self.checkpointer.load_latest(state, own) is None:
                return 0
        elif resume_from:
            branch_step(resume_from)
            self.checkpointer.load(resume_from, state)
        else:
            return 0
        self.step = int(state["trainer"]["step"])
        self.tokens = int(state["trainer"]["tokens"])
        saved = state["rng"].get(f"rank{self.rank}", {})
        self.window = _Window.on(self.module.device, start_time=0.0)
        self.window.resume(saved.get(_WINDOW_KEY), self._layout)
        restore_rng(state["rng"], self.rank, self.module.device)
        return self.step

    # -- the loop -----------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        check_same_run(self.cfg, self.run_dir)
        start_step = self.restore()
        self._record_worker_group(start_step)
        total = self.info.total_steps
        # Only now, with the resume accepted: a refused one leaves the run dir as it was.
        self._write_config()
        earlier = [g.time for g in self.workers[:-1]]  # rank 0's: when each earlier start began
        # From "running" on, every ending is recorded: a Ctrl+C in the callbacks' start too
        try:
            self._write_run_json("running")
            self._emit(
                "on_start",
                {
                    **self.info.__dict__,
                    "start_step": start_step,
                    "total_steps": total,
                    "earlier_starts": earlier,
                },
            )
            started = time.time()
            self._run_steps(start_step, total)
        except NonFiniteLossError:
            # Every rank raises it at once, so together they can still commit the async save
            # in flight: a step that passed the finite check, the newest good one. A failure
            # there is logged: the divergence stays the run's error (Ray reports it, not retries).
            if self.checkpointer is not None:
                try:
                    self.checkpointer.wait()
                except CheckpointError as e:
                    log.warning("the async save before the divergence was lost: %s", e)
            raise
        except (DataError, ConfigError) as e:
            # Bad shards or config found mid-run: no retry can fix them, so run.json says so
            # instead of staying "running".
            self._write_run_json("failed", error=str(e))
            raise
        except KeyboardInterrupt:
            self.record_interrupt()
            raise
        except CheckpointException as e:
            # A Ctrl+C mid-save: DCP catches every rank's error, a KeyboardInterrupt's too,
            # and raises them together as this (a BaseException).
            if not any(_from_interrupt(err) for err, _ in e.failures.values()):
                raise
            self.record_interrupt()
            raise KeyboardInterrupt from e
        finally:
            self._emit("flush")
        if self.checkpointer is not None:
            self.checkpointer.close()
        summary = {
            "name": self.info.name,
            "steps": self.step,
            "tokens": self.tokens,
            "elapsed_s": time.time() - started,
            **self.last_metrics,
        }
        self._write_run_json("finished")
        self._emit("on_end", summary)
        return summary

    def record_interrupt(self) -> None:
        """Ctrl+C: run.json says "interrupted", as the run is neither running nor failed (the same
        command resumes it) and so no later reader takes it for either."""
        self._write_run_json("interrupted")

    def interruption(self) -> str:
        """The one line an interrupted run ends with (:func:`interruption_line`)."""
        return interruption_line(self.step, self.run_dir, self.cfg.checkpoint)

    def _run_steps(self, start_step: int, total: int) -> None:
        """The loop. A step that neither logs, evaluates nor saves never waits for the device:
        the non-finite check is read (:meth:`_check_finite`) only on steps that do."""
        batches = self.train_batches(start_step)
        self.window.start_time = self.clock()
        while self.step < total:
            stats = self.module.train_batch(next(batches))
            lr = self.module.lr  # this update's LR; optim_step moves it to the next one's
            norm = self.module.optim_step()
            self.module.zero_grads()
            self.step += 1
            self.tokens += self.info.global_batch_tokens
            self.window.add(self.step, stats, norm)
            log = self.step % self.cfg.trainer.log_interval == 0 or self.step == total
            evaluate = self.has_evals and (
                self.step % self.cfg.trainer.eval_interval == 0 or self.step == total
            )
            save = self._save_decision(clock=log)
            if log or evaluate or save != "none":
                self._check_finite()
            metrics: dict[str, float] = {}
            if evaluate or (save == "permanent" and self.has_evals):
                metrics.update(self._run_evals())
            if log:
                # after this step's eval (its time is on this line), before its checkpoint,
                # which follows the record and so is counted on the next line
                metrics.update(self._log_metrics(stats, norm, lr))
                self.window = _Window.on(self.module.device, self.clock())
            if metrics or save != "none":
                # The step's record goes out before its checkpoint commits: a kill after the
                # commit cannot lose it, a kill before resumes earlier and drops it with the
                # replayed steps (JsonlMetrics.on_start).
                metrics["tokens"] = self.tokens
                metrics["annealed"] = float(self.step in self.annealed_steps)
                self.last_metrics.update(metrics)
                self._emit("on_log", self.step, metrics)
                if save != "none":
                    # what callbacks send out before a checkpoint (a bucket's uploads) is
                    # checkpoint time, not step time
                    self._timed("checkpoint_s", self._emit, "flush")
                    self._timed("checkpoint_s", self._checkpoint, save == "permanent", metrics, lr)
                self._emit("on_step_end", self.step)

    @property
    def has_evals(self) -> bool:
        return bool(self.eval_batches_data) or self.task_evaluator is not None

    def _run_evals(self) -> dict[str, float]:
        """The held-out loss and the tasks, each timed on its own: neither is step time."""
        metrics: dict[str, float] = {}
        if self.eval_batches_data:
            metrics["eval/loss"] = self._timed("eval_s", self.evaluate)
        if self.task_evaluator is not None:
            metrics.update(self._timed("task_eval_s", self.evaluate_tasks))
        return metrics

    def evaluate_tasks(self) -> dict[str, float]:
        """``task/<name>/...`` over every DP rank's share of the examples."""
        group = self.module.dp_group
        where = collective_device(group, self.module.device)

        def all_reduce(sums: torch.Tensor) -> torch.Tensor:
            if self.world_size == 1 or self.module.dp_size == 1:
                return sums
            sums = sums.to(where)
            dist.all_reduce(sums, group=group)
            return sums

        return self.task_evaluator.evaluate(self.module.logits, self.module.device, all_reduce)

    def evaluate(self) -> float:
        ce = torch.zeros((), device=self.module.device)
        n = torch.zeros((), device=self.module.device)
        for batch in self.eval_batches_data:
            s, c = self.module.eval_batch(batch)
            ce += s
            n += c
        group = self.module.dp_group
        pair = torch.stack([ce, n.float()]).to(collective_device(group, self.module.device))
        if self.world_size > 1:
            dist.all_reduce(pair, group=group)
        return (pair[0] / pair[1].clamp(min=1)).item()

    # -- internals ----------------------------------------------------------------------------

    def _timed(self, field_name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, its seconds added to the window's ``field_name``."""
        start = self.clock()
        try:
            return fn(*args)
        finally:
            elapsed = self.clock() - start
            setattr(self.window, field_name, getattr(self.window, field_name) + elapsed)

    def _check_finite(self) -> None:
        """Stop the run if a step since the last check had a non-finite loss or gradient norm
        (one host sync). The run's record then ends at the step before that one."""
        bad_step, ce, tokens, norm = self.window.first_bad.tolist()
        if not bad_step:
            return
        undone = self.step - (int(bad_step) - 1)
        self.step -= undone
        self.tokens -= undone * self.info.global_batch_tokens
        self._write_run_json("diverged", diverged_step=self.step + 1)
        raise NonFiniteLossError(self.step + 1, ce / max(tokens, 1), norm)

    def _log_metrics(self, last: BatchStats, norm: torch.Tensor, lr: float) -> dict[str, float]:
        """The log line's figures: the window's sums made global over the DP group on the
        device :func:`collective_device` names, then read on the host at once."""
        window = self.window
        group = self.module.dp_group
        where = collective_device(group, self.module.device)
        ce, z, tokens, norms = window.sums
        last_ce, last_tokens = last.ce_sum.double(), last.num_tokens.double()
        sums = torch.stack([ce, tokens, last_ce, last_tokens, z]).to(where)
        if self.world_size > 1 and self.module.dp_size > 1:
            dist.all_reduce(sums, group=group)
        local = torch.stack([norms / window.steps, norm.double()]).to(where)
        ce, tokens, last_ce, last_tokens, z, grad_norm, grad_norm_last = torch.cat(
            [sums, local]
        ).tolist()
        wall = self.clock() - window.start_time
        elapsed = max(wall - window.eval_s - window.task_eval_s - window.checkpoint_s, 1e-9)
        tokens_per_s = (window.steps - window.carried) * self.info.global_batch_tokens / elapsed
        flops_per_s = tokens_per_s * self.info.flops_per_token
        z_loss = {"train/z_loss": z / tokens} if self.module.cfg.z_loss_multiplier else {}
        task_s = {"time/task_eval_s": window.task_eval_s} if self.task_evaluator else {}
        if self.peak_measured:
            self.peak_flops = max(self.peak_flops, flops_per_s / self.world_size)
        return {
            "train/loss": ce / tokens,
            "train/loss_last": last_ce / last_tokens,
            **z_loss,
            "train/grad_norm": grad_norm,
            "train/grad_norm_last": grad_norm_last,
            "lr": lr,
            "throughput/tokens_per_s": tokens_per_s,
            "throughput/tokens_per_s_per_device": tokens_per_s / self.world_size,
            "throughput/mfu": flops_per_s / (self.peak_flops * self.world_size),
            "time/eval_s": window.eval_s,
            "time/checkpoint_s": window.checkpoint_s,
            **task_s,
        }

    def _save_decision(self, *, clock: bool) -> str:
        """The save this step gets: none, temporary or permanent (which comes with an eval).
        ``clock``: consult the minute clock (log steps only: it costs every rank a sync)."""
        if self.checkpointer is None:
            return "none"
        return self.policy.decide_all_ranks(
            self.step,
            time.time(),
            final=self.step == self.info.total_steps,
            clock=clock,
            device=self.module.device,
        )

    def _checkpoint(self, permanent: bool, metrics: dict[str, float], lr: float) -> None:
        """Save this step. A permanent save's metrics file holds this step's eval, tokens, LR and
        ``annealed`` flag, over whatever the last log line said."""
        saved = {**self.last_metrics, **metrics, "lr": lr}  # the checkpointer adds step and tokens
        path = self.checkpointer.save(
            self.step, self.app_state(), tokens=self.tokens, permanent=permanent, metrics=saved
        )
        self._emit("on_checkpoint", self.step, path, permanent)

    def _emit(self, hook: str, *args: Any) -> None:
        """Call a hook on every callback of this rank (rank-0-only callbacks exist only there)."""
        for cb in self.callbacks:
            getattr(cb, hook)(*args)

    def _record_worker_group(self, start_step: int) -> None:
        """Rank 0 appends this (re)start's per-rank placement to the run's worker groups."""
        ranks = all_gather_object({"host": socket.gethostname(), **self.placement})
        if self.rank == 0:
            group = WorkerGroup(start_step=start_step, time=time.time(), ranks=ranks)
            self.workers = [*worker_groups(self.run_dir), group]

    def _write_config(self) -> None:
        if self.rank != 0:
            return
        storage.makedirs(self.run_dir)
        write_atomic(config_path(self.run_dir), to_yaml(self.cfg))

    def _write_run_json(
        self, status: str, diverged_step: int | None = None, error: str | None = None
    ) -> None:
        if self.rank != 0:
            return
        storage.makedirs(self.run_dir)
        write_run_json(
            self.run_dir,
            self.info,
            status,
            last_step=self.step,
            diverged_step=diverged_step,
            workers=self.workers,
            error=error,
        )


def _from_interrupt(error: BaseException) -> bool:
    """Whether ``error`` is a KeyboardInterrupt or was raised while one was handled: a Ctrl+C
    inside ``torch.save``'s zip writer comes out of its ``__exit__`` as a RuntimeError
    ("unexpected pos ...") whose context is the interrupt."""
    return any(isinstance(e, KeyboardInterrupt) for e in exception_chain(error))
