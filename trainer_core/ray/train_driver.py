"""Driver side of one Ray Train run: config -> TorchTrainer -> fit -> summary.

The run dir is Ray's experiment dir (``storage_path`` = its parent, ``name`` = its name), so a
restarted driver that builds the same TorchTrainer finds the run again and resumes it.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import ray.data
import ray.train

from trainer_core.checkpoint.listing import complete_checkpoints
from trainer_core.config.decode import ConfigError
from trainer_core.data.token_data import open_token_data
from trainer_core.errors import RunFailedError
from trainer_core.io import storage
from trainer_core.io.run_dir import (
    FINAL_STATUSES,
    mark_failed,
    metrics_path,
    read_run_json,
    worker_groups,
)
from trainer_core.io.storage import Location
from trainer_core.ray.failures import FailFastTorchTrainer, fatal_reason
from trainer_core.ray.reader import dataset_name, rank_dataset
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.ray.worker import train_worker
from trainer_core.train.same_run import check_same_run


def build_torch_trainer(
    cfg: RayTrainConfig, tags: dict[str, Any] | None = None, callbacks: list | None = None
):
    rc = cfg.ray
    dp_size = cfg.layout().dp_size
    run_dir = cfg.trainer.run_dir
    resources = {"CPU": rc.cpus_per_worker}
    if rc.use_gpu:
        resources["GPU"] = rc.gpus_per_worker
    datasets = {
        dataset_name(r): functools.partial(rank_dataset, cfg, r, dp_size)
        for r in range(dp_size)
        if rc.reader == "ray_data"
    }
    return FailFastTorchTrainer(
        train_worker,
        train_loop_config={"train": cfg, "tags": tags or {}, "fit_started_at": time.time()},
        scaling_config=ray.train.ScalingConfig(
            num_workers=rc.num_workers, use_gpu=rc.use_gpu, resources_per_worker=resources
        ),
        run_config=ray.train.RunConfig(
            name=storage.name(run_dir),
            storage_path=str(storage.parent(run_dir)),
            failure_config=ray.train.FailureConfig(max_failures=rc.max_failures),
            callbacks=callbacks or [],
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
        ),
        datasets=datasets,
        # Each rank reads its own dataset, in order (Ray Data reorders blocks unless told not to).
        dataset_config=ray.train.DataConfig(
            datasets_to_split=[],
            execution_options=ray.data.ExecutionOptions(preserve_order=True),
        ),
    )


def run_summary(run_dir: Location) -> dict[str, Any]:
    """run.json plus the last logged metrics: what a finished (or resumed-and-finished) run reports."""
    summary = read_run_json(run_dir) or {}
    metrics_file = metrics_path(run_dir)
    if storage.is_file(metrics_file):
        for line in storage.read_text(metrics_file).splitlines():
            try:
                summary.update(json.loads(line))
            except json.JSONDecodeError:
                continue
    return summary


def run_training(
    cfg: RayTrainConfig,
    tags: dict[str, Any] | None = None,
    callbacks: list | None = None,
    done: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run (or resume) one training run on Ray Train and return its summary.

    Idempotent: a run whose run.json says finished/diverged returns its summary at once, which
    is what makes a restored Tune experiment safe to re-run trials. A failure raises
    :class:`RunFailedError` with the reason: at once for bad input (no retry can fix it), after
    ``ray.max_failures`` restarts for anything else. ``done``: the run's :func:`run_summary`,
    when the caller read it already (a Tune trial, to see whether the run ended).
    """
    if cfg.ray.runner == "trial":
        raise ConfigError(
            "ray.runner: 'trial' trains a run inside a ladder's or sweep's Tune trial; a single "
            "run goes on Ray Train: use 'train' (or 'auto')"
        )
    run_dir = cfg.trainer.run_location
    check_same_run(cfg, run_dir)
    done = run_summary(run_dir) if done is None else done
    if done.get("status") in FINAL_STATUSES:
        return done
    # Unusable shards fail here, as one line, before any Ray Train process starts (in the
    # controller they would fail too, but under Ray's logged traceback).
    open_token_data(cfg.data, cfg.model.vocab_size)
    try:
        build_torch_trainer(cfg, tags, callbacks).fit()
    except ray.train.TrainingFailedError as e:
        reason = ray_train_reason(e)
        if len(worker_groups(run_dir)) > len(done.get("workers", [])):
            # This launch trained, and rank 0 (run.json's writer) may not have seen the error:
            # another rank's bad shard, a worker lost with no restart left. A launch refused
            # before training (a checkpoint that doesn't fit) leaves the record as it was.
            mark_failed(run_dir, reason)
        raise RunFailedError(failure_message(run_dir, reason)) from None
    return run_summary(run_dir)


def ray_train_reason(error: Exception) -> str:
    """What stopped a Ray Train run: the user error's message whole, else the last line of
    Ray's report, not its tracebacks."""
    reason = fatal_reason(error)
    if reason is None:
        lines = [line for line in str(error).splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else type(error).__name__
    return reason


def failure_message(run_dir: Location, reason: str) -> str:
    """Why the run stopped and, when it saved a checkpoint, that a re-run resumes from it: with
    none there is nothing to resume, and the hint would promise work that was never kept."""
    message = f"run {storage.name(run_dir)} failed: {reason}"
    if not complete_checkpoints(run_dir, warn=False):
        return message
    return (
        f"{message}\n  checkpoints and metrics so far are kept in {run_dir}; fix the cause and "
        "re-run the same command to resume"
    )
