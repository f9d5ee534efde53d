"""Connecting to Ray quietly: the submitted-to cluster, an explicit address, or a local Ray.

Every entry point and benchmark starts or joins Ray through :func:`init_ray`, nowhere else.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings

import ray

from trainer_core.config.loader import ConfigError
from trainer_core.errors import RunWarning, print_run_warnings_as_lines
from trainer_core.ray.probe import probe

# Reports are barriers that wait for a controller poll; a short poll keeps them ~0.1 s instead of ~2 s.
RAY_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # Reports at temporary checkpoints carry no eval loss; Tune must not reject them.
    "TUNE_DISABLE_STRICT_METRIC_CHECKING": "1",
    "RAY_AIR_NEW_OUTPUT": "0",
    # Tune copies AWS_* from the driver's environment into each trial's runtime env, and the
    # runtime-env agent of a Ray started from here logs every runtime env at INFO: keys included.
    "RAY_LOGGER_LEVEL": "warning",
    # A reused trial process waits this long for the previous trial's thread to end (a stopped
    # trial's thread ends at its parked report at once; 2 s, Tune's default, is less than one
    # step or checkpoint of a larger model, and a failed reuse errors the next trial).
    "TUNE_FUNCTION_THREAD_TIMEOUT_S": "60",
}


EXPECTED_NOISE = (
    "ray.data._internal.progress",
    "ray.train.v2._internal.callbacks.backend_setup",
)
"""Loggers whose warnings are expected here: Ray Data says the progress bars RAY_ENV turned off
are off; Ray Train prints a traceback when it cannot shut down the workers of a trial that Tune's
early stopping has just killed. They get a filter, not a level: Ray later configures their parent
loggers with ``dictConfig``, which resets child levels but keeps filters."""


TRIAL_ERRORS = ("ray.tune.execution.tune_controller", "ray.tune.tune")
"""Tune's loggers of failed trials: each failure with its traceback (~35 lines), then the list
of trials that did not complete. The driver says it in one line instead: a retry's from
``tune_run.retry_line``, a failed experiment's from ``tune_run.trial_failures``."""


DATA_ERRORS = ("ray.data.exceptions", "ray.data._internal.execution.streaming_executor_state")
"""Ray Data's loggers of a failed dataset: the failed task's error with its traceback, then, as
the error leaves the dataset's iterator, "internal code ... open an issue" and the traceback
again (~160 lines). A read task's user error (a corrupt shard) is no UserCodeException once
``raise_original_map_exception`` keeps its type (``reader.ray_train_dataset``), so Ray Data
takes it for its own bug; the driver's one line says what it is."""


UNHANDLED = "ray._private.worker"
"""The logger that prints errors of tasks whose result nobody read."""


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


class _NoTrialErrors(logging.Filter):
    """Drops Tune's reports of failed trials (:data:`TRIAL_ERRORS`) that the driver's one line
    explains: a user error's (bad input, a run that failed or was lost, each already one line).
    A bug's traceback stays: its one line alone would not say where it happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Trials did not complete"):
            return False
        if not message.startswith("Trial task failed for trial ") or not record.exc_info:
            return True
        from trainer_core.ray.failures import user_error_in

        error = record.exc_info[1]
        return user_error_in(error) is None


class _NoDataUserErrors(logging.Filter):
    """Drops Ray Data's reports (:data:`DATA_ERRORS`) of a user error raised in a read task.
    Its "open an issue" line carries no exception: it is logged while handling it, hence the
    fallback to the one being handled. Every other Ray Data error stays, traceback and all."""

    def filter(self, record: logging.LogRecord) -> bool:
        from trainer_core.ray.failures import user_error_in

        error = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        return error is None or user_error_in(error) is None


class _NoStatsActorRace(logging.Filter):
    """Ray Data's metrics actor can receive a dataset's execution metrics before its registration
    (or after evicting it); the KeyError then surfaces as an "Unhandled error" with a traceback
    from Ray's internals. Only a dashboard gauge is lost, the data and the training are not."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "_StatsActor.update_execution_metrics" not in record.getMessage()


def quiet_ray_loggers() -> None:
    """Turn Ray Data / Train's per-dataset and per-report INFO lines down and Tune's and Ray
    Data's tracebacks of user errors off, in any Ray process.

    Run at the start of every Ray worker process (``worker_process_setup_hook``) and again by the
    train loop. Ray configures those loggers one by one, so each one is turned down, not just the
    parents; some are named after their file (``logging.getLogger(__file__)``).
    """
    paths = tuple(f"{os.sep}ray{os.sep}{pkg}{os.sep}" for pkg in ("data", "train"))
    names = [
        n
        for n in logging.root.manager.loggerDict
        if n.startswith(("ray.data", "ray.train")) or any(p in n for p in paths)
    ]
    for name in ["ray.data", "ray.train", *names]:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name, noise in (
        *((n, _ErrorsOnly) for n in EXPECTED_NOISE),
        *((n, _NoTrialErrors) for n in TRIAL_ERRORS),
        *((n, _NoDataUserErrors) for n in DATA_ERRORS),
        (UNHANDLED, _NoStatsActorRace),
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, noise) for f in logger.filters):
            logger.addFilter(noise())


def drop_exit_during_teardown(unraisable) -> None:
    """``sys.unraisablehook`` of Ray worker processes: a SystemExit there is Ray's SIGTERM
    handler ending the process (Tune stopping a trial) while a weakref callback ran; Python
    would print it as "Exception ignored in ... SystemExit: 1" with a traceback, forwarded to
    the user's terminal. Anything else goes to Python's own hook."""
    if not issubclass(unraisable.exc_type, SystemExit):
        sys.__unraisablehook__(unraisable)


process_ready_at = float("nan")
"""When this Ray worker process ran its setup hook (``time.time()``), for start-up timings."""


def setup_worker_process() -> None:
    """The ``worker_process_setup_hook`` of every Ray this project starts or joins.

    Besides quieting Ray's loggers and printing run warnings as lines it pins ``RAY_ADDRESS`` to the worker's own cluster: Ray Train's
    placement-group cleaner (a detached actor) looks its controller up through the state API
    without an address, and with a second Ray on the machine (a ``ray start --head`` of the
    README's walk-through beside a local ladder) that lookup fails ("multiple active Ray
    instances") or finds the other cluster and takes the live controller for dead: the cleaner
    then removes the run's placement group, or exits and guards nothing if none is registered yet.
    """
    global process_ready_at
    process_ready_at = time.time()
    sys.unraisablehook = drop_exit_during_teardown
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    quiet_ray_loggers()
    print_run_warnings_as_lines()


STARTUP_CONCURRENCY = "RAY_worker_maximum_startup_concurrency"
MIN_STARTUP_CONCURRENCY = 16
"""Python processes a Ray started here may start at once: at least this many, though Ray's
default is the node's CPU count. Ray warns ("N PYTHON worker processes have been started ...
Kx the maximum expected startup concurrency", a link to a Ray issue) once four times that many
are up. A trial here is about four processes that hold almost no CPU (its driver, its Ray Train
controller and placement-group cleaner, a worker per device), so on 2 cores the demo's two
trials at a time drew the warning twice per launch. A cluster started by ``ray start`` keeps
its own setting."""


def init_ray(
    address: str = "", *, num_cpus: int | None = None, dashboard: bool | None = None
) -> None:
    """Start or join Ray once per process, with Ray's own logging turned down to errors.

    ``address`` as ``ray.address`` reads it: empty joins the cluster RAY_ADDRESS names (as under
    ``ray job submit``) or one found on this machine, else starts a local Ray; "local" always
    starts a new local Ray, of ``num_cpus`` CPUs (default: all) and with the dashboard unless
    ``dashboard`` is False. A joined cluster keeps its own resources.
    """
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        return
    cpus = num_cpus or os.cpu_count() or 1
    os.environ.setdefault(STARTUP_CONCURRENCY, str(max(cpus, MIN_STARTUP_CONCURRENCY)))
    cluster = address or os.environ.get("RAY_ADDRESS", "")
    if cluster not in ("", "local", "auto"):
        check_reachable(cluster, "ray.address" if address else "RAY_ADDRESS")
    local = {"num_cpus": num_cpus, "include_dashboard": dashboard} if address == "local" else {}
    context = ray.init(
        address=address or None,
        logging_config=ray.LoggingConfig(log_level="ERROR"),
        runtime_env={
            "env_vars": {k: os.environ[k] for k in RAY_ENV},
            "worker_process_setup_hook": "trainer_core.ray.runtime.setup_worker_process",
        },
        **local,
    )
    quiet_ray_loggers()
    if cluster not in ("", "local") and not context.dashboard_url:
        warnings.warn(NO_DASHBOARD.format(cluster=cluster), RunWarning, stacklevel=2)


NO_DASHBOARD = (
    "the Ray cluster at {cluster} runs without its dashboard: each Ray Train run leaves a "
    "placement-group cleaner behind (a process of ~200 MB that never exits: it learns that its "
    "run ended through the dashboard's state API); start the cluster with the dashboard, as "
    "`ray start --head` and cluster.yaml do unless --include-dashboard=false"
)
"""Ray Train V2's ``PlacementGroupCleaner``, a detached actor per run, polls its controller
through the state API and only exits once it sees the controller dead (measured: a driver
killed on a cluster with the dashboard, the cleaner gone in seconds; without one, it stays)."""


def check_reachable(address: str, source: str) -> None:
    """Refuse, in one line naming ``source``, a cluster address where nothing answers: Ray would
    retry its GCS connection for minutes, printing only its own timeouts. And a dashboard URL
    (the RAY_ADDRESS the README exports for ``ray job submit``), which Ray refuses with a
    traceback."""
    scheme, sep, rest = address.partition("://")
    if scheme in ("http", "https"):
        raise ConfigError(
            f"{source}: {address!r} is the dashboard's Jobs API, which `ray job submit` takes: "
            "submit this script to it (ray job submit, or workflows/submit.py), or give the "
            "cluster itself here as host:6379"
        )
    if sep and scheme != "ray":
        return  # not a GCS or client address: Ray's own handling
    host_port = rest if sep else address
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"{source}: {address!r} is not host:port (or ray://host:port, local, auto): "
            "give the head node's address, e.g. 10.0.0.5:6379"
        )
    try:
        probe(host.strip("[]"), int(port))
    except OSError as e:
        raise ConfigError(
            f"{source}: nothing answers at {host_port} ({e.strerror or e}); start the cluster "
            "(ray start --head, ray up cluster.yaml) or fix the address"
        ) from None


def submitted_or_local() -> str:
    """The address for a job that must not share a Ray it did not start: the cluster it was
    submitted to (RAY_ADDRESS), else "local", a new Ray even when one runs on this machine."""
    return "" if os.environ.get("RAY_ADDRESS") else "local"
