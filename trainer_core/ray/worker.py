"""What each Ray Train worker runs: build the library's trainer, feed it Ray Data, report to Ray.

Checkpoints are written by the library's checkpointer straight into the run dir, which is also
Ray's experiment dir, and registered with Ray without a copy (``NO_UPLOAD``). On a worker-group
restart the loop resumes from the latest *complete* checkpoint in the run dir; the per-rank
datasets are rebuilt from that same step, so which checkpoint Ray itself tracks never matters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_core.callbacks import BaseCallback
from trainer_core.configio import from_dict
from trainer_core.ray.config import RayTrainConfig
from trainer_core.ray.runtime import quiet_ray_loggers


def dataset_name(dp_rank: int) -> str:
    return f"train_dp{dp_rank}"


class RayReporter(BaseCallback):
    """Reports metrics (every rank: ``ray.train.report`` is a barrier) at eval and checkpoint steps."""

    def __init__(self, report_on_log: bool):
        self.report_on_log = report_on_log
        self.pending: Path | None = None

    def on_checkpoint(self, step: int, path: Path, permanent: bool) -> None:
        self.pending = path

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        import ray.train

        if not (self.report_on_log or self.pending or "eval/loss" in metrics):
            return
        checkpoint = None
        if self.pending is not None and ray.train.get_context().get_world_rank() == 0:
            checkpoint = ray.train.Checkpoint(str(self.pending.resolve()))
        self.pending = None
        ray.train.report(
            {"step": step, **metrics},
            checkpoint=checkpoint,
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.NO_UPLOAD,
        )


def train_worker(config: dict[str, Any]) -> None:
    """The ``train_loop_per_worker`` of the TorchTrainer."""
    import ray.train

    from trainer_core.distributed import teardown
    from trainer_core.ray.data import batches_from_shard
    from trainer_core.run import build_trainer
    from trainer_core.trainer import NonFiniteLossError

    quiet_ray_loggers()  # again: Train and Data loggers created since process start
    cfg = from_dict(RayTrainConfig, config["train"])
    tp = cfg.parallel.tp
    dp_rank = ray.train.get_context().get_world_rank() // tp
    rows_per_rank = cfg.trainer.global_batch_size // cfg.data.seq_len // (cfg.ray.num_workers // tp)
    shard = ray.train.get_dataset_shard(dataset_name(dp_rank))

    def train_batches(start_step: int):
        return batches_from_shard(shard, rows_per_rank, expected_start_step=start_step)

    trainer = build_trainer(
        cfg,
        train_batches=train_batches,
        extra_callbacks=[RayReporter(cfg.ray.report_on_log)],
        tags=config.get("tags"),
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
