"""Ray's own chatter: what the user never sees and what still gets through."""

from __future__ import annotations

import logging
import sys
import weakref

import pytest
from ray.exceptions import RayTaskError

from trainer_core.config.loader import ConfigError
from trainer_core.data.shards import ShardError
from trainer_core.errors import RunFailedError
from trainer_core.ray.runtime import (
    DATA_ERRORS,
    TRIAL_ERRORS,
    UNHANDLED,
    check_reachable,
    drop_exit_during_teardown,
    quiet_ray_loggers,
)

# The line Ray printed mid-demo (a race inside Ray Data's metrics actor), shortened.
STATS_RACE = (
    "Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): "
    "ray::_StatsActor.update_execution_metrics() (pid=16506, ip=192.0.2.2)\n"
    "KeyError: 'train_dp0_0352lnObg4aO0WD9jlN1zV_0'"
)


def _passes(
    name: str, message: str, level: int = logging.ERROR, error: BaseException | None = None
) -> bool:
    exc_info = (type(error), error, None) if error is not None else None
    record = logging.LogRecord(name, level, "worker.py", 439, message, None, exc_info)
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


def test_tunes_reports_of_failed_trials_are_dropped_and_its_other_errors_kept():
    """Tune logged each failed trial with its traceback (~35 lines) and then the trials that did
    not complete, before the driver's own one-line summary of the same failures. A bug's
    traceback is kept: the summary's one line would not say where it happened."""
    quiet_ray_loggers()
    controller, tune = TRIAL_ERRORS
    failed = RunFailedError("run 25K failed: no checkpoint passes its checksums")
    assert not _passes(controller, "Trial task failed for trial 25K", error=failed)
    assert _passes(controller, "Trial task failed for trial 25K", error=AttributeError("x"))
    assert not _passes(tune, "Trials did not complete: [25K]")
    assert _passes(controller, "Could not re-use actor for trial 25K: ...")
    assert _passes(tune, "Trial 25K: something else went wrong")


def test_ray_datas_reports_of_a_corrupt_shard_are_dropped_and_its_other_errors_kept():
    """A read task's ShardError reached the console as a Ray Data internal error: its traceback
    twice and "please open an issue" (~160 lines) above the driver's one line. Ray hands the
    error over as a RayTaskError that is (or holds) the ShardError; the "open an issue" line is
    logged without it, while handling it."""
    quiet_ray_loggers()
    exceptions, executor = DATA_ERRORS
    corrupt = ShardError("part-00002.parquet: row group 0 is corrupt")
    task_error = RayTaskError("MapBatches(_read_windows)", "Traceback ...", corrupt)
    failed = 'An exception was raised from a task of operator "MapBatches(_read_windows)".'
    assert not _passes(executor, failed, error=task_error.as_instanceof_cause())
    assert not _passes(executor, failed, error=task_error)
    assert not _passes(exceptions, "Full stack trace:", error=task_error.as_instanceof_cause())
    internal = "Exception occurred in Ray Data or Ray Core internal code. ... open an issue"
    try:
        raise task_error.as_instanceof_cause()
    except RayTaskError:
        assert not _passes(exceptions, internal)
    bug = RayTaskError("MapBatches(_read_windows)", "Traceback ...", KeyError("tokens"))
    assert _passes(executor, failed, error=bug.as_instanceof_cause())
    assert _passes(exceptions, "Full stack trace:", error=RuntimeError("a Ray Data bug"))
    try:
        raise bug.as_instanceof_cause()
    except RayTaskError:
        assert _passes(exceptions, internal)
    assert _passes(exceptions, internal)


def _unraisable(exc: BaseException):
    """What Python hands ``sys.unraisablehook`` when a weakref callback raises ``exc``."""
    caught = []

    def callback(_ref):
        raise exc

    class Referent:
        pass

    saved, sys.unraisablehook = sys.unraisablehook, caught.append
    try:
        referent = Referent()
        ref = weakref.ref(referent, callback)
        del referent
    finally:
        sys.unraisablehook = saved
    assert ref() is None and len(caught) == 1
    return caught[0]


def test_a_trial_process_ended_by_sigterm_prints_no_traceback(capsys):
    """Ray's SIGTERM handler raises SystemExit; landing in a weakref callback, Python printed
    it as "Exception ignored in ... SystemExit: 1" with a traceback (seen from a stopped Tune
    trial). That one is dropped; any other unraisable error is still printed."""
    drop_exit_during_teardown(_unraisable(SystemExit(1)))
    assert capsys.readouterr().err == ""
    drop_exit_during_teardown(_unraisable(ValueError("a real bug")))
    assert "ValueError: a real bug" in capsys.readouterr().err
    assert sys.unraisablehook is not drop_exit_during_teardown  # set in Ray workers only


def test_a_cluster_address_where_nothing_answers_is_refused_at_once(
    processes, free_port, tiny_args, tmp_path
):
    """Ray retried its GCS connection for minutes, printing only its own timeouts."""
    port = free_port()
    args = tiny_args(tmp_path / "run", f"--ray.address=127.0.0.1:{port}")
    out = processes.python("workflows/train.py", *args, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"ray.address: nothing answers at 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr
    with pytest.raises(ConfigError, match="ray.address: 'head' is not host:port"):
        check_reachable("head", "ray.address")
    with pytest.raises(ConfigError) as e:
        check_reachable("http://127.0.0.1:8265", "RAY_ADDRESS")  # the README's, for job submit
    assert str(e.value) == (
        "RAY_ADDRESS: 'http://127.0.0.1:8265' is the dashboard's Jobs API, which `ray job "
        "submit` takes: submit this script to it (ray job submit, or workflows/submit.py), or "
        "give the cluster itself here as host:6379"
    )
