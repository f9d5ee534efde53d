"""Which failures Ray Train may retry: a lost worker or node, yes; bad input, never.

Ray Train retries every worker error up to ``FailureConfig.max_failures`` times from the latest
checkpoint. That is right for a killed worker and useless for a config, checkpoint or shard that
will be just as wrong on the next try (a refused checkpoint took 61 s and five tracebacks to
fail). So the worker wraps those errors (:class:`trainer_core.errors.UserError`, found anywhere
in the exception's chain) in :class:`FatalRunError`, and :class:`FailFastTorchTrainer` gives Ray's
controller a failure policy that stops the run at once on one of those.

Ray 2.60 has no public switch for this: the policy goes in through ``TorchTrainer``'s own
controller set-up and Ray's failure-policy base class (tests pin the behaviour, so an upgrade
that moves them fails loudly in ``tests/e2e/test_ray_train.py``).
"""

from __future__ import annotations

from ray.exceptions import ActorUnavailableError
from ray.train import ControllerError, WorkerGroupError
from ray.train.torch import TorchTrainer
from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError
from ray.train.v2._internal.execution.failure_handling import (
    DefaultFailurePolicy,
    FailureDecision,
)

from trainer_core.errors import RunFailedError, UserError, exception_chain


class FatalRunError(RuntimeError):
    """A worker error that no retry can fix; the message is the user error's, whole."""


def user_error_in(error: BaseException) -> BaseException | None:
    """The user error (config, data, checkpoint) that caused ``error``, if any: a Ray task
    error's ``cause`` (the exception the task raised), then Python's chain."""
    cause = getattr(error, "cause", None)
    error = cause if isinstance(cause, BaseException) else error
    return next(
        (e for e in exception_chain(error) if isinstance(e, (FatalRunError, UserError))), None
    )


class RunLostError(RunFailedError):
    """The run's Ray Train controller died (its process killed, its node lost). Said in one
    line as any run failure is, but nothing says the run itself is wrong, so a Tune trial
    retries it (``ray.max_failures``): the retry resumes from the latest checkpoint, as a
    restarted worker group does."""


def unretriable_error(error: BaseException) -> BaseException | None:
    """The user error in ``error`` that a retry would only repeat, if any: every one but a lost
    controller (:class:`RunLostError`), the one run failure a retry resumes."""
    found = user_error_in(error)
    return None if isinstance(found, RunLostError) else found


def last_line(error: BaseException) -> str:
    """The last line of Ray's report of ``error`` (its cause, after the tracebacks)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def _original(error: BaseException) -> BaseException:
    """The exception a worker or the controller raised, out of Ray Train's wrappers.

    Ray keeps a worker's exception in a wrapper that carries its formatted traceback; that
    wrapper has no public accessor for the exception, hence the attribute lookup. A worker that
    died or stopped answering comes as the failed health check holding Ray's actor error.
    """
    while True:
        if isinstance(error, ControllerError):
            error = error.controller_failure
        elif isinstance(error, WorkerHealthCheckFailedError):
            error = error.health_check_failure
        elif hasattr(error, "_base_exc"):
            error = error._base_exc
        else:
            return error


def fatal_reason(error: BaseException) -> str | None:
    """The message of the non-retriable error that failed a Ray Train run (None: none did)."""
    if isinstance(error, WorkerGroupError):
        causes = list(error.worker_failures.values())
    else:
        causes = [error]
    for cause in causes:
        found = user_error_in(_original(cause))
        if found is not None:
            return str(found)
    return None


def failure_causes(error: BaseException) -> str:
    """What failed a worker group attempt, in one clause: each rank's error by its last line,
    ranks with the same error named together."""
    if not isinstance(error, WorkerGroupError):
        return f"its workers did not start ({last_line(_original(error))})"
    ranks: dict[str, list[int]] = {}
    for rank, cause in sorted(error.worker_failures.items()):
        ranks.setdefault(_worker_cause(_original(cause)), []).append(rank)
    return "; ".join(
        f"rank{'s' * (len(r) > 1)} {', '.join(map(str, r))}: {line}" for line, r in ranks.items()
    )


def _worker_cause(error: BaseException) -> str:
    """A rank's error by its last line, or, for a worker that stopped answering before Ray knew
    why, what that means (Ray's line names the actor id and says only that it is unavailable)."""
    if isinstance(error, ActorUnavailableError):
        return "its worker stopped answering (its node lost, or the network)"
    return last_line(error)


class FailFastPolicy(DefaultFailurePolicy):
    """Ray's default policy, except that a fatal error stops the run at once; and a restart is
    said in one line named by the run (``run``), as its other lines are. Ray's own account of
    it, the decision logged with a traceback, is below the level Ray's loggers are set to."""

    def __init__(self, failure_config, run: str):
        super().__init__(failure_config)
        self.run = run
        self.restarts: dict[str, int] = {}

    def make_decision(self, training_failed_error) -> FailureDecision:
        if fatal_reason(training_failed_error) is not None:
            return FailureDecision.RAISE
        decision = super().make_decision(training_failed_error)
        if decision == FailureDecision.RETRY:
            budget, limit = self._budget(training_failed_error)
            self.restarts[budget] = n = self.restarts.get(budget, 0) + 1
            print(
                f"[{self.run}] {failure_causes(training_failed_error)}; Ray Train restarts the "
                f"workers from the latest checkpoint (restart {n}, {budget} "
                f"{'-1: no limit' if limit < 0 else limit})",
                flush=True,
            )
        return decision

    def _budget(self, error: BaseException) -> tuple[str, int]:
        """The retry budget Ray charges ``error`` to, as the setting that sets it: a worker group
        that failed to start is the controller's (Ray Train's own limit, not the run's)."""
        if isinstance(error, ControllerError):
            return (
                "Ray Train's controller_failure_limit",
                self.failure_config.controller_failure_limit,
            )
        return "ray.max_failures", self.failure_config.max_failures


class FailFastTorchTrainer(TorchTrainer):
    """A ``TorchTrainer`` whose controller uses :class:`FailFastPolicy` for run ``run``."""

    def __init__(self, *args, run: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.run = run

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        policy = FailFastPolicy(self.run_config.failure_config, self.run)
        controller_init_kwargs["failure_policy"] = policy
        return super()._initialize_and_run_controller(**controller_init_kwargs)
