"""What each Ray Train worker runs: build the library's trainer, feed it Ray Data (or, with
``ray.reader: worker``, let it read its own rank's rows as the plain loop does), report to Ray.

Checkpoints are written by the library's checkpointer straight into the run dir, which is also
Ray's experiment dir; Ray does not track them. On a worker-group restart the loop resumes from
the latest *complete* checkpoint in the run dir, and the per-rank datasets are rebuilt from that
same step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import ray.train

from trainer_core.io.storage import Location
from trainer_core.parallel.process_group import teardown
from trainer_core.ray import runtime
from trainer_core.ray.failures import FatalRunError, user_error_in
from trainer_core.ray.reader import batches_from_shard, dataset_name, resume_step
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.ray.runtime import quiet_ray_loggers
from trainer_core.train.callbacks import BaseCallback

if TYPE_CHECKING:
    import torch


class RayReporter(BaseCallback):
    """Reports metrics (every rank: ``ray.train.report`` is a barrier) at eval and checkpoint
    steps, once the step's checkpoint (if any) is committed.

    Checkpoints are not registered with Ray: the library's checkpointer owns them (it prunes
    superseded temporaries and sets corrupt ones aside), and Ray Train refuses to restart a run
    whose snapshot names a checkpoint that is gone. Resuming reads the run dir, never Ray's list.
    """

    def __init__(self, report_on_log: bool):
        self.report_on_log = report_on_log
        self.metrics: dict[str, float] | None = None
        self.saved = False

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        self.metrics = metrics

    def on_checkpoint(self, step: int, path: Location, permanent: bool) -> None:
        self.saved = True

    def on_step_end(self, step: int) -> None:
        metrics, saved = self.metrics or {}, self.saved
        self.metrics, self.saved = None, False
        if self.report_on_log or saved or "eval/loss" in metrics:
            ray.train.report({"step": step, **metrics})


class StartupClock(BaseCallback):
    """Prints, once per worker-group start, when rank 0 reached each stage of its start-up, in
    seconds after the driver called ``fit``: where a short trial's first seconds go."""

    def __init__(self, fit_started_at: float | None):
        self.marks: dict[str, float] = {
            "worker process ready": runtime.process_ready_at,
            "train fn": time.time(),
        }
        self.t0 = fit_started_at

    def mark(self, stage: str) -> None:
        self.marks.setdefault(stage, time.time())

    def on_start(self, info: dict[str, Any]) -> None:
        self.mark("trainer built")

    def on_step_end(self, step: int) -> None:
        if "first step" in self.marks or self.t0 is None:
            return
        self.mark("first step")
        stages = ", ".join(f"{k} +{t - self.t0:.1f}" for k, t in self.marks.items())
        print(f"[startup] after fit(): {stages} s")


class DataPositionChanged(RuntimeError):
    """The resume fell back past a corrupt checkpoint after Ray Data was set up to start at it.

    Retriable on purpose: the restarted worker group's datasets are built from the new latest
    checkpoint (the corrupt one has been moved aside), so the retry resumes exactly.
    """


RAY_TRAIN_FN_ERRORS = "ray.train.v2._internal.util"
"""The logger Ray Train writes every training-function error to, traceback included."""


class _NoFatalTraceback(logging.Filter):
    """Drops Ray's traceback of a :class:`FatalRunError`: its message reaches the user whole
    from the driver, in one line; the traceback (of this module) would only bury it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "FatalRunError" not in record.getMessage()


def train_worker(config: dict[str, Any]) -> None:
    """The ``train_loop_per_worker`` of the TorchTrainer.

    Input errors (config, data, checkpoint) leave as :class:`FatalRunError`, which Ray does not
    retry; divergence is reported as a result; anything else is Ray's to retry.
    """
    errors = logging.getLogger(RAY_TRAIN_FN_ERRORS)
    if not any(isinstance(f, _NoFatalTraceback) for f in errors.filters):
        errors.addFilter(_NoFatalTraceback())
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
                f"{data_start} failed its checksums; restarting the workers so the data "
                f"starts at step {start_step}"
            )
        return batches_from_shard(shard, rows_per_rank, expected_start_step=start_step)

    return train_batches


def _train(config: dict[str, Any]) -> None:
    # The training stack is imported here, not at module level: Ray Train's controller and the
    # Tune trial driver unpickle ``train_worker`` by reference, so they import this module, and
    # the trainer's checkpointer pulls in torch.distributed.checkpoint (~1.2 s a process).
    from trainer_core.train.build import build_trainer
    from trainer_core.train.trainer import NonFiniteLossError

    clock = StartupClock(config.get("fit_started_at"))
    quiet_ray_loggers()  # again: Train and Data loggers created since process start
    cfg: RayTrainConfig = config["train"]
    trainer = build_trainer(
        cfg,
        train_batches=ray_data_batches(cfg) if cfg.ray.reader == "ray_data" else None,
        extra_callbacks=[clock, RayReporter(cfg.ray.report_on_log)],
        tags=config.get("tags"),
        placement={"node_id": ray.get_runtime_context().get_node_id()},
    )
    try:
        trainer.fit()
    except NonFiniteLossError as e:
        # Divergence is a result (an LR too high), not a failure to retry: every rank sees the
        # same global grad norm, so all ranks get here and report together.
        print(f"[rank {ray.train.get_context().get_world_rank()}] {e}")
        ray.train.report({"step": e.step, "diverged": 1, "diverged_step": e.step})
    finally:
        teardown()
