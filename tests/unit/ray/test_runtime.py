"""Ray's own chatter: what the user never sees and what still gets through."""

from __future__ import annotations

import logging

from trainer_core.ray.runtime import UNHANDLED, quiet_ray_loggers

# The line Ray printed mid-demo (a race inside Ray Data's metrics actor), shortened.
STATS_RACE = (
    "Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): "
    "ray::_StatsActor.update_execution_metrics() (pid=16506, ip=192.0.2.2)\n"
    "KeyError: 'train_dp0_0352lnObg4aO0WD9jlN1zV_0'"
)


def _passes(name: str, message: str, level: int = logging.ERROR) -> bool:
    record = logging.LogRecord(name, level, "worker.py", 439, message, None, None)
    return bool(logging.getLogger(name).filter(record))


def test_ray_data_metrics_race_is_dropped_but_other_unhandled_errors_are_not():
    quiet_ray_loggers()
    quiet_ray_loggers()  # idempotent: one filter, however often a process calls it
    assert not _passes(UNHANDLED, STATS_RACE)
    assert _passes(UNHANDLED, "Unhandled error: ray::train_fn() ValueError: bad shard")
    assert len(logging.getLogger(UNHANDLED).filters) == 1


def test_expected_warnings_are_dropped_and_errors_kept():
    quiet_ray_loggers()
    name = "ray.train.v2._internal.callbacks.backend_setup"
    assert not _passes(name, "could not shut down workers", logging.WARNING)
    assert _passes(name, "worker group failed", logging.ERROR)
