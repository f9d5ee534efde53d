"""Connecting to Ray quietly: the submitted-to cluster, an explicit address, or a local Ray."""

from __future__ import annotations

import logging
import os

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
}


EXPECTED_NOISE = (
    "ray.data._internal.progress",
    "ray.train.v2._internal.callbacks.backend_setup",
)
"""Loggers whose warnings are expected here: Ray Data says the progress bars RAY_ENV turned off
are off; Ray Train prints a traceback when it cannot shut down the workers of a trial that Tune's
early stopping has just killed. They get a filter, not a level: Ray later configures their parent
loggers with ``dictConfig``, which resets child levels but keeps filters."""


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def quiet_ray_loggers() -> None:
    """Turn Ray Data / Train's per-dataset and per-report INFO lines down, in any Ray process.

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
    for name in EXPECTED_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ErrorsOnly) for f in logger.filters):
            logger.addFilter(_ErrorsOnly())


def init_ray(address: str = "") -> None:
    """Start or join Ray once per process, with Ray's own logging turned down to errors.

    Under ``ray job submit`` RAY_ADDRESS points at the cluster and ``ray.init`` joins it; with
    nothing running, a local Ray starts on this machine (the embedded default).
    """
    import ray

    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        return
    ray.init(
        address=address or None,
        logging_config=ray.LoggingConfig(log_level="ERROR"),
        runtime_env={
            "env_vars": {k: os.environ[k] for k in RAY_ENV},
            "worker_process_setup_hook": "trainer_core.ray.runtime.quiet_ray_loggers",
        },
    )
