"""The training loop: steps, logging, evaluation and checkpoints at step boundaries.

The loop is the same in a single process, under ``torchrun`` and inside a Ray Train worker; what
differs is injected: where batches come from (``train_batches(start_step)``) and extra callbacks.
A step is one optimizer update; ``step`` counts updates done, so a checkpoint at step N resumes
with update N + 1 and the batch for step N (0-based index of the next batch).
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trainer_core.checkpoint.checkpointer import Checkpointer
from trainer_core.checkpoint.keep import CheckpointPolicy
from trainer_core.checkpoint.rng import restore_rng, rng_state
from trainer_core.config.loader import ConfigError, to_yaml
from trainer_core.config.sections import TrainConfig
from trainer_core.data.shards import DataError
from trainer_core.errors import UserError
from trainer_core.io import storage
from trainer_core.io.run_dir import (
    RunInfo,
    WorkerGroup,
    config_path,
    worker_groups,
    write_run_json,
)
from trainer_core.io.storage import write_atomic
from trainer_core.parallel.process_group import all_gather_object
from trainer_core.train.callbacks import Callback
from trainer_core.train.train_module import BatchStats, TrainModule


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
            "run stopped before this update and no checkpoint was written after it. Lower "
            "optim.lr, raise schedule.warmup or set train_module.max_grad_norm."
        )


@dataclass
class _Window:
    """Sums since the last log line. Eval and checkpoint seconds are kept apart so the step
    throughput (tokens/s, MFU) measures training alone."""

    ce: float = 0.0
    z: float = 0.0
    tokens: float = 0.0
    grad_norms: list[float] = field(default_factory=list)
    start_time: float = field(default_factory=time.perf_counter)
    steps: int = 0
    eval_s: float = 0.0
    checkpoint_s: float = 0.0


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
        callbacks: list[Callback] | None = None,
        placement: dict[str, str] | None = None,
    ):
        """``placement``: where this rank runs as its launcher knows it (the Ray worker passes
        its node id), recorded in run.json beside the host name."""
        self.cfg, self.module, self.info = cfg, module, info
        self.placement = placement or {}
        self.workers: list[WorkerGroup] = []
        self.train_batches, self.eval_batches_data = train_batches, eval_batches
        self.rank, self.world_size, self.peak_flops = rank, world_size, peak_flops
        self.callbacks = callbacks or []
        self.run_dir = storage.normalize(cfg.trainer.run_dir)
        self.step = 0
        self.tokens = 0
        self.last_metrics: dict[str, float] = {}
        ckpt = cfg.checkpoint
        self.checkpointer = (
            Checkpointer(self.run_dir, ckpt, rank=rank, world_size=world_size)
            if ckpt.enabled
            else None
        )
        self.policy = CheckpointPolicy(ckpt) if ckpt.enabled else None

    # -- state --------------------------------------------------------------------------------

    def app_state(self) -> dict[str, Any]:
        return {
            "train_module": self.module,
            "trainer": {"step": self.step, "tokens": self.tokens},
            "rng": rng_state(self.rank),
        }

    def restore(self) -> int:
        """Load the latest complete checkpoint of the run that verifies (see
        :meth:`Checkpointer.load_latest`); a run with none yet starts from
        ``checkpoint.resume_from`` (exactly that one) when set.

        So a run branched from another's checkpoint resumes, after a failure, from its own
        progress, not from the branch point again (:func:`trainer_core.ray.reader.resume_step`
        follows the same rule for the data)."""
        if self.checkpointer is None:
            return 0
        state = self.app_state()
        resume_from = self.cfg.checkpoint.resume_from
        if resume_from and not self.checkpointer.has_checkpoint():
            self.checkpointer.load(resume_from, state)
        elif self.checkpointer.load_latest(state) is None:
            return 0
        self.step = int(state["trainer"]["step"])
        self.tokens = int(state["trainer"]["tokens"])
        restore_rng(state["rng"], self.rank)
        return self.step

    # -- the loop -----------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        start_step = self.restore()
        self._record_worker_group(start_step)
        total = self.info.total_steps
        # Only now, with the resume accepted: a refused one leaves the run dir as it was.
        self._write_config()
        self._write_run_json("running")
        self._emit(
            "on_start", {**self.info.__dict__, "start_step": start_step, "total_steps": total}
        )
        started = time.time()
        try:
            self._run_steps(start_step, total)
        except (DataError, ConfigError) as e:
            # Bad shards or config found mid-run: no retry can fix them, so run.json says so
            # instead of staying "running".
            self._write_run_json("failed", error=str(e))
            raise
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

    def _run_steps(self, start_step: int, total: int) -> None:
        batches = self.train_batches(start_step)
        window = _Window()
        while self.step < total:
            stats = self.module.train_batch(next(batches))
            lr = self.module.lr  # this update's LR; optim_step moves it to the next one's
            norm = self.module.optim_step()
            self.module.zero_grads()
            loss_local = stats.ce_sum.item()
            if not (math.isfinite(norm.item()) and math.isfinite(loss_local)):
                self._write_run_json("diverged", diverged_step=self.step + 1)
                mean = loss_local / max(stats.num_tokens.item(), 1)
                raise NonFiniteLossError(self.step + 1, mean, norm.item())
            self.step += 1
            self.tokens += self.info.global_batch_tokens
            self._accumulate(window, stats, norm)
            metrics: dict[str, float] = {}
            if self.eval_batches_data and (
                self.step % self.cfg.trainer.eval_interval == 0 or self.step == total
            ):
                metrics["eval/loss"] = self._timed(window, "eval_s", self.evaluate)
            save = self._save_decision()
            if save == "permanent" and self.eval_batches_data and "eval/loss" not in metrics:
                metrics["eval/loss"] = self._timed(window, "eval_s", self.evaluate)
            if self.step % self.cfg.trainer.log_interval == 0 or self.step == total:
                # after this step's eval (its time is on this line), before its checkpoint,
                # which follows the record and so is counted on the next line
                metrics.update(self._log_metrics(window, stats, norm, lr))
                window = _Window()
            if metrics or save != "none":
                # The step's record goes out before its checkpoint commits: a kill after the
                # commit cannot lose it, a kill before resumes earlier and drops it with the
                # replayed steps (JsonlMetrics.on_start).
                metrics["tokens"] = self.tokens
                self.last_metrics.update(metrics)
                self._emit("on_log", self.step, metrics)
                if save != "none":
                    self._emit("flush")
                    self._timed(
                        window, "checkpoint_s", self._checkpoint, save == "permanent", metrics, lr
                    )
                self._emit("on_step_end", self.step)

    def evaluate(self) -> float:
        ce = torch.zeros((), device=self.module.device)
        n = torch.zeros((), device=self.module.device)
        for batch in self.eval_batches_data:
            s, c = self.module.eval_batch(batch)
            ce += s
            n += c
        pair = torch.stack([ce, n.float()])
        if self.world_size > 1:
            dist.all_reduce(pair, group=self.module.dp_group)
        return (pair[0] / pair[1].clamp(min=1)).item()

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _timed(window: _Window, field_name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, its seconds added to the window's ``field_name``."""
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            elapsed = time.perf_counter() - start
            setattr(window, field_name, getattr(window, field_name) + elapsed)

    def _accumulate(self, window: _Window, stats: BatchStats, norm: torch.Tensor) -> None:
        window.ce += stats.ce_sum.item()
        window.z += stats.z_sum.item()
        window.tokens += stats.num_tokens.item()
        window.grad_norms.append(norm.item())
        window.steps += 1

    def _log_metrics(
        self, window: _Window, last: BatchStats, norm: torch.Tensor, lr: float
    ) -> dict[str, float]:
        sums = torch.tensor(
            [window.ce, window.tokens, last.ce_sum.item(), last.num_tokens.item(), window.z],
            dtype=torch.float64,
        )
        if self.world_size > 1 and self.module.dp_size > 1:
            dist.all_reduce(sums, group=self.module.dp_group)
        wall = time.perf_counter() - window.start_time
        elapsed = max(wall - window.eval_s - window.checkpoint_s, 1e-9)
        tokens_per_s = window.steps * self.info.global_batch_tokens / elapsed
        flops_per_s = tokens_per_s * self.info.flops_per_token
        z_loss = (
            {"train/z_loss": (sums[4] / sums[1]).item()}
            if self.module.cfg.z_loss_multiplier
            else {}
        )
        return {
            "train/loss": (sums[0] / sums[1]).item(),
            "train/loss_last": (sums[2] / sums[3]).item(),
            **z_loss,
            "train/grad_norm": sum(window.grad_norms) / len(window.grad_norms),
            "train/grad_norm_last": norm.item(),
            "lr": lr,
            "throughput/tokens_per_s": tokens_per_s,
            "throughput/tokens_per_s_per_device": tokens_per_s / self.world_size,
            "throughput/mfu": flops_per_s / (self.peak_flops * self.world_size),
            "time/eval_s": window.eval_s,
            "time/checkpoint_s": window.checkpoint_s,
        }

    def _save_decision(self) -> str:
        """The save this step gets: none, temporary or permanent (which comes with an eval)."""
        if self.checkpointer is None:
            return "none"
        if self.step == self.info.total_steps and self.cfg.checkpoint.save_final:
            return "permanent"
        return self.policy.decide_all_ranks(self.step, time.time())

    def _checkpoint(self, permanent: bool, metrics: dict[str, float], lr: float) -> None:
        """Save this step. A permanent save's metrics file holds this step's eval, tokens and LR
        (whether the point is annealed), over whatever the last log line said."""
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
