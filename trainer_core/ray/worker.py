"""What each Ray Train worker runs: build the library's trainer, feed it Ray Data (or, with
``ray.reader: worker``, let it read its own rank's rows as the plain loop does), report to Ray.

Checkpoints are written by the library's checkpointer straight into the run dir, which is also
Ray's experiment dir; Ray does not track them. On a worker-group restart the loop resumes from
the latest *complete* checkpoint in the run dir, and the per-rank datasets are rebuilt from that
same step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import ray.train

from trainer_core.io.storage import Location
from trainer_core.parallel.process_group import teardown
from trainer_core.ray import runtime
from trainer_core.ray.failures import FatalRunError, user_error_in
from trainer_core.ray.node_view import check_node_sees
from trainer_core.ray.reader import batches_from_shard, dataset_name, resume_step
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.ray.runtime import quiet_ray_loggers
from trainer_core.train.callbacks import BaseCallback

if TYPE_CHECKING:
    import torch


class RayReporter(BaseCallback):
    """Reports metrics through ``report`` (``ray.train.report`` on every rank: it is a barrier;
    ``tune.report`` in a trial-runner trial) at eval and checkpoint steps, once the step's
    checkpoint (if any) is committed.

    Checkpoints are not registered with Ray: the library's checkpointer owns them (it prunes
    superseded temporaries and sets corrupt ones aside), and Ray Train refuses to restart a run
    whose snapshot names a checkpoint that is gone. Resuming reads the run dir, never Ray's list.
    """

    def __init__(self, report: Callable[[dict[str, Any]], None], report_on_log: bool):
        self.report = report
        self.report_on_log = report_on_log
        self.metrics: dict[str, float] | None = None
        self.saved = self.saved_permanent = False
        self.commit: Callable[[], None] = lambda: None
        """Finishes an async save (``Checkpointer.wait``). Run before a report that follows a
        permanent save: the save returned before its commit, and a scheduler that stops the
        trial at this report (ASHA at the last rung) ends the process before the commit would
        have run, losing the decay point and its metrics. Temporary saves stay asynchronous."""

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        self.metrics = metrics

    def on_checkpoint(self, step: int, path: Location, permanent: bool) -> None:
        self.saved = True
        self.saved_permanent = permanent

    def on_step_end(self, step: int) -> None:
        metrics, saved, permanent = self.metrics or {}, self.saved, self.saved_permanent
        self.metrics, self.saved, self.saved_permanent = None, False, False
        if permanent:
            self.commit()
        if self.report_on_log or saved or "eval/loss" in metrics:
            self.report({"step": step, **metrics})


class StartupClock(BaseCallback):
    """Prints, once per start of the training loop, when it reached each stage of its start-up,
    in seconds after ``t0`` (``since`` names that moment): where a short trial's first seconds
    go. "first log" is the first logged step (a log interval of 1 makes it the first step).
    Rank 0 alone prints: the ranks start together, and N copies of the line would bury it.

    A worker group that Ray Train restarted inside the same ``fit()`` (the run's record holds a
    start since ``t0``) is timed from its own process instead: from ``fit()`` its line counted
    the failed group's training as start-up."""

    def __init__(self, t0: float | None, since: str, rank: int = 0):
        ready = runtime.process_ready_at
        # a process that an earlier trial started has no start-up of its own to show
        self.marks = {"process ready": ready} if t0 is None or ready >= t0 else {}
        self.marks["train fn"] = time.time()
        self.t0 = t0 if rank == 0 else None
        self.since = since
        self.run = ""

    def mark(self, stage: str) -> None:
        self.marks.setdefault(stage, time.time())

    def on_start(self, info: dict[str, Any]) -> None:
        self.mark("trainer built")
        self.run = info["name"]
        restarted = self.t0 is not None and any(t >= self.t0 for t in info["earlier_starts"])
        if restarted and math.isfinite(runtime.process_ready_at):
            self.t0 = self.marks.pop("process ready", runtime.process_ready_at)
            self.since = "this restarted worker group's process came up"

    def on_step_end(self, step: int) -> None:
        if "first log" in self.marks or self.t0 is None:
            return
        self.mark("first log")
        stages = ", ".join(f"{k} +{t - self.t0:.1f}" for k, t in self.marks.items())
        # prefixed by the run as its other lines are: a sweep's trials start side by side
        print(f"[{self.run}] [startup] after {self.since}: {stages} s (first log: step {step})")


class DataPositionChanged(RuntimeError):
    """The resume fell back past a corrupt checkpoint after Ray Data was set up to start at it.

    Retriable on purpose: the restarted worker group's datasets are built from the new latest
    checkpoint (the corrupt one has been moved aside), so the retry resumes exactly.
    """


RAY_TRAIN_FN_ERRORS = "ray.train.v2._internal.util"
"""The logger Ray Train writes every training-function error to, traceback included."""


class _NoTracebackOfSaidErrors(logging.Filter):
    """Drops Ray's traceback of a :class:`FatalRunError` (its message reaches the user whole
    from the driver, in one line) and of a :class:`DataPositionChanged` (the restart it asks for
    is said in one line by the controller, ``failures.FailFastPolicy``): the traceback, of this
    module, would only bury them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(c.__name__ in message for c in (FatalRunError, DataPositionChanged))


def train_worker(config: dict[str, Any]) -> None:
    """The ``train_loop_per_worker`` of the TorchTrainer.

    Input errors (config, data, checkpoint) leave as :class:`FatalRunError`, which Ray does not
    retry; divergence is reported as a result; anything else is Ray's to retry.
    """
    errors = logging.getLogger(RAY_TRAIN_FN_ERRORS)
    if not any(isinstance(f, _NoTracebackOfSaidErrors) for f in errors.filters):
        errors.addFilter(_NoTracebackOfSaidErrors())
    try:
        _train(config)
    except Exception as e:
        cause = user_error_in(e)
        if cause is None:
            raise
        raise FatalRunError(str(cause)) from None


def ray_data_batches(cfg: RayTrainConfig) -> Callable[[int], Iterator[torch.Tensor]]:
    """This rank's batches from its Ray Data dataset, which the driver built to start at the
    latest complete checkpoint's step (read before the first collective, so before any rank
    can change it)."""
    layout = cfg.layout(ray.train.get_context().get_world_rank())
    rows_per_rank = cfg.batch_seqs // layout.dp_size
    shard = ray.train.get_dataset_shard(dataset_name(layout.dp_rank))
    data_start = resume_step(cfg)

    def train_batches(start_step: int) -> Iterator[torch.Tensor]:
        if start_step != data_start:
            raise DataPositionChanged(
                f"resumed at step {start_step}, not {data_start}: the checkpoint of step "
                f"{data_start} failed its checksums after the data was set to start there"
            )
        return batches_from_shard(shard, rows_per_rank, expected_start_step=start_step)

    return train_batches


def _train(config: dict[str, Any]) -> None:
    cfg: RayTrainConfig = config["train"]
    quiet_ray_loggers()  # again: Train and Data loggers created since process start
    check_node_sees(config.get("driver_view"))
    rank = ray.train.get_context().get_world_rank()
    fit_and_report(
        cfg,
        ray.train.report,
        rank=rank,
        train_batches=ray_data_batches(cfg) if cfg.ray.reader == "ray_data" else None,
        clock=StartupClock(config.get("fit_started_at"), "fit()", rank),
        tags=config.get("tags"),
    )


def fit_and_report(
    cfg: RayTrainConfig,
    report: Callable[[dict[str, Any]], None],
    *,
    rank: int = 0,
    train_batches: Callable[[int], Iterator[torch.Tensor]] | None = None,
    clock: StartupClock | None = None,
    tags: dict[str, Any] | None = None,
) -> None:
    """Build this rank's trainer, fit it and report through ``report``: what a Ray Train worker
    and a trial-runner trial (:mod:`trainer_core.ray.trial_runner`) both do."""
    # The training stack is imported here, not at module level: Ray Train's controller and the
    # Tune trial driver unpickle ``train_worker`` by reference, so they import this module, and
    # the trainer's checkpointer pulls in torch.distributed.checkpoint (~1.2 s a process).
    from trainer_core.train.build import build_trainer
    from trainer_core.train.trainer import NonFiniteLossError

    reporter = RayReporter(report, cfg.ray.report_on_log)
    trainer = build_trainer(
        cfg,
        train_batches=train_batches,
        extra_callbacks=[*([clock] if clock else []), reporter],
        tags=tags,
        placement={"node_id": ray.get_runtime_context().get_node_id()},
    )
    if trainer.checkpointer is not None:
        reporter.commit = trainer.checkpointer.wait
    try:
        trainer.fit()
    except NonFiniteLossError as e:
        # Divergence is a result (an LR too high), not a failure to retry: every rank sees the
        # same global grad norm, so all ranks get here and report together.
        print(divergence_line(cfg, rank, e))
        report({"step": e.step, "diverged": 1, "diverged_step": e.step})
    finally:
        teardown()


def divergence_line(cfg: RayTrainConfig, rank: int, error: Exception) -> str:
    """A rank's line on its run's divergence, prefixed by the run as the run's other lines are
    (trials of a ladder or sweep print side by side)."""
    return f"[{cfg.run_name}] rank {rank}: {error}"
