"""Driver side of one Ray Train run: config -> TorchTrainer -> fit -> summary.

The run dir is Ray's experiment dir (``storage_path`` = its parent, ``name`` = its name), so a
restarted driver that builds the same TorchTrainer finds the run again and resumes it.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from typing import Any

import ray.data
import ray.train
from ray.exceptions import RayActorError

from trainer_core.checkpoint.checksums import checksum_problems
from trainer_core.checkpoint.listing import complete_checkpoints, interruption_line, listed_files
from trainer_core.config.decode import ConfigError
from trainer_core.data.token_data import open_token_data
from trainer_core.errors import RunFailedError, RunWarning
from trainer_core.io import storage
from trainer_core.io.run_dir import (
    FINAL_STATUSES,
    mark_failed,
    mark_interrupted,
    metric_records,
    metrics_path,
    read_run_json,
    worker_groups,
)
from trainer_core.io.storage import Location
from trainer_core.ray.failures import FailFastTorchTrainer, RunLostError, fatal_reason, last_line
from trainer_core.ray.node_view import DriverView, data_inputs, driver_view
from trainer_core.ray.reader import dataset_name, rank_dataset
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.ray.worker import train_worker
from trainer_core.train.same_run import check_same_run


class RunInterruptedError(KeyboardInterrupt):
    """Ctrl+C (or SIGTERM, under :func:`~trainer_core.io.sigterm.sigterm_as_ctrl_c`) stopped a
    run on Ray Train; the message is the one line saying where and how to go on. A
    KeyboardInterrupt, so a caller that does not print it still ends as an interrupted command."""


def build_torch_trainer(
    cfg: RayTrainConfig,
    tags: dict[str, Any] | None = None,
    callbacks: list | None = None,
    view: DriverView | None = None,
):
    """The run's TorchTrainer; ``view``: what its workers check they see as the driver does."""
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
        train_loop_config={
            "train": cfg,
            "tags": tags or {},
            "fit_started_at": time.time(),
            "driver_view": view,
        },
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
        run=cfg.run_name,
    )


def run_summary(run_dir: Location) -> dict[str, Any]:
    """run.json plus the last logged metrics: what a finished (or resumed-and-finished) run reports."""
    summary = read_run_json(run_dir) or {}
    for _, record in metric_records(metrics_path(run_dir)):
        summary.update(record)
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
    ``ray.max_failures`` restarts for anything else. A Ctrl+C of the driver (its main thread)
    records the run interrupted and raises :class:`RunInterruptedError`. ``done``: the run's
    :func:`run_summary`, when the caller read it already (a Tune trial, to see whether the run
    ended).
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
    view = driver_view(run_dir, "trainer.run_dir", data_inputs(cfg.data))
    if done.get("workers"):  # an earlier launch started: it may have lost its controller
        release_orphaned_worker_groups()
    try:
        build_torch_trainer(cfg, tags, callbacks, view).fit()
    except ray.train.TrainingFailedError as e:
        reason = ray_train_reason(e)
        _record_failure(run_dir, done, reason)
        raise RunFailedError(failure_message(run_dir, reason)) from None
    except RayActorError as e:
        # Not recorded as failed: Tune itself removes a trial's placement group, and with it the
        # controller, when it stops the trial (Ctrl+C, SIGTERM, an early stop); the run is then
        # resumable, which run.json must go on saying.
        reason = f"its Ray Train controller was lost: {last_line(e)}"
        raise RunLostError(failure_message(run_dir, reason, verify=False)) from None
    except SystemExit:
        # Ray Train's SIGINT handler, which fit sets in the main thread only, aborts the run
        # (its workers killed before rank 0 can record the interrupt) and ends fit this way.
        if threading.current_thread() is not threading.main_thread():
            raise
        step = mark_interrupted(run_dir)
        raise RunInterruptedError(interruption_line(step, run_dir, cfg.checkpoint)) from None
    return run_summary(run_dir)


def release_orphaned_worker_groups() -> None:
    """Remove this job's placement groups whose creator, an actor, is dead: the worker groups
    of Ray Train controllers lost (killed, or with their Tune trial's process).

    Ray keeps a group that an actor created until the actor's *job* ends too, so a retried
    trial would wait for good for the CPUs (or GPUs) its lost controller's workers held. Ray
    Train's own cleaner removes them only where Ray's state API answers (a cluster with its
    dashboard). A group the driver created (Tune's) has no creator actor; one a live
    controller created is kept. Ray shows a group's creator only in its GCS table, through its
    internals: where a Ray release moved them, a warning instead of a failed launch.
    """
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    try:
        from ray._private.state import state
        from ray.core.generated.gcs_pb2 import PlacementGroupTableData

        table = state._connect_and_get_accessor().get_placement_group_table()
    except (ImportError, AttributeError) as e:
        warnings.warn(
            f"could not look for a lost controller's worker group ({e}): a retried run may wait "
            "for the CPUs/GPUs it held until the Ray job ends",
            RunWarning,
            stacklevel=2,
        )
        return
    job = bytes.fromhex(ray.get_runtime_context().get_job_id())
    no_actor = ray.ActorID.nil().binary()
    for raw in table:
        group = PlacementGroupTableData.FromString(raw)
        orphaned = group.creator_actor_dead and group.creator_actor_id != no_actor
        if (
            orphaned
            and group.creator_job_id == job
            and not group.is_detached
            and group.state != PlacementGroupTableData.REMOVED
        ):
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(group.placement_group_id)))


def _record_failure(run_dir: Location, done: dict[str, Any], reason: str) -> None:
    """Record the run failed when this launch trained: rank 0 (run.json's writer) may not have
    seen the error (another rank's bad shard, a worker lost with no restart left, its worker
    group killed with the controller). A launch refused before training (a checkpoint that
    doesn't fit) leaves the record as it was."""
    if len(worker_groups(run_dir)) > len(done.get("workers", [])):
        mark_failed(run_dir, reason)


def ray_train_reason(error: Exception) -> str:
    """What stopped a Ray Train run: the user error's message whole, else the last line of
    Ray's report, not its tracebacks."""
    reason = fatal_reason(error)
    return last_line(error) if reason is None else reason


def failure_message(run_dir: Location, reason: str, verify: bool = True) -> str:
    """Why the run stopped and, when it holds a checkpoint to resume from, that a re-run
    resumes: with none (or, where ``verify``, none that passes its checksums) there is nothing
    to resume, and the hint would promise work that was never kept. ``verify=False`` for a lost
    controller: Tune stops trials that way too (Ctrl+C), and a stop is no time to read every
    checkpoint's bytes; the retry's resume checks them anyway."""
    message = f"run {storage.name(run_dir)} failed: {reason}"
    if not has_resumable_checkpoint(run_dir, verify):
        return message
    return (
        f"{message}\n  checkpoints and metrics so far are kept in {run_dir}; fix the cause and "
        "re-run the same command to resume"
    )


def has_resumable_checkpoint(run_dir: Location, verify: bool = True) -> bool:
    """Whether the run has a complete checkpoint that (where ``verify``) passes its checksums,
    newest first: what a resume would load. Verifying reads the newest one's files, as that
    resume would (a failure's cost)."""
    return any(
        not verify or not checksum_problems(info.path, listed_files(info.path))
        for info in reversed(complete_checkpoints(run_dir, warn=False))
    )
