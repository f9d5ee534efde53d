"""The "trial" runner (``ray.runner``): a one-worker run trained in its Tune trial's own process.

On Ray Train a trial starts a controller, a placement-group cleaner, a synchronization actor and
a worker process, each a fresh interpreter importing its stack: ~20 s before the first step on
2 cores (benchmarks/RESULTS.md, "Trial start-up"), most of a short sweep trial. Here the trial's
process is the worker: it holds the run's CPUs (and GPU), reads its own rows as the plain loop
does and reports straight to Tune. Fault tolerance moves up one level: Tune restarts a failed
trial (``ray.max_failures`` times) and the restarted trial resumes from the run dir's latest
complete checkpoint, as a restarted worker group would. Bad input is not retried: the trial
driver (:func:`trainer_core.ray.tune_run.trial_driver`) reports :data:`NO_RETRY` before it
raises, and :class:`NoRetryOnUserError` tells Tune. A trial's process goes on to the next trial
of the same shape (Tune's actor reuse), so only the first trial per slot pays for the process
and its imports.
"""

from __future__ import annotations

from typing import Any

from ray import tune

from trainer_core.errors import RunFailedError
from trainer_core.ray.failures import user_error_in
from trainer_core.ray.run_config import RayConfig, RayTrainConfig
from trainer_core.ray.train_driver import failure_message, run_summary
from trainer_core.ray.worker import StartupClock, fit_and_report

NO_RETRY = "no_retry"
"""A result key: the trial failed on bad input (config, data, checkpoint); do not restart it."""


def run_in_trial(cfg: RayTrainConfig, tags: dict[str, Any], started_at: float) -> dict[str, Any]:
    """Run (or resume) ``cfg`` in this Tune trial's process; its summary, as
    :func:`trainer_core.ray.train_driver.run_training` returns it (a run that already ended
    never gets here: :func:`trainer_core.ray.tune_run.trial_driver` reports its record).
    ``started_at``: when the trial function began (the start-up clock's zero)."""
    run_dir = cfg.trainer.run_location
    try:
        fit_and_report(
            cfg,
            tune.report,
            clock=StartupClock(started_at, "the trial function began"),
            tags=tags,
        )
    except Exception as e:
        cause = user_error_in(e)
        if cause is None:
            raise
        raise RunFailedError(failure_message(run_dir, str(cause))) from None
    return run_summary(run_dir)


def trial_resources(rc: RayConfig) -> tune.PlacementGroupFactory:
    """The trial's own process holds its run's one worker: its CPUs and GPU."""
    bundle = {"CPU": rc.cpus_per_worker}
    if rc.use_gpu:
        bundle["GPU"] = rc.gpus_per_worker
    return tune.PlacementGroupFactory([bundle])


class NoRetryOnUserError(tune.Callback):
    """Tune restarts every failed trial alike (``FailureConfig.max_failures``); a trial that
    reported :data:`NO_RETRY` is about to fail on input that a restart would meet again, so it
    gets no more restarts. Results reach Tune in order, so this lands before the error does."""

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if result.get(NO_RETRY):
            trial.max_failures = 0
