"""Ray Train's failure decisions as the controller makes them: a restart said in one line named
by the run, the last failure and a fatal one left to the driver's line."""

from __future__ import annotations

from ray.exceptions import ActorUnavailableError
from ray.train import ControllerError, FailureConfig, WorkerGroupError
from ray.train.v2._internal.exceptions import (
    WorkerGroupStartupTimeoutError,
    WorkerHealthCheckFailedError,
)
from ray.train.v2._internal.execution.failure_handling import FailureDecision

from trainer_core.ray.failures import FailFastPolicy, FatalRunError


def lost(**ranks: str) -> WorkerGroupError:
    return WorkerGroupError(
        "workers failed", {int(r[1:]): RuntimeError(m) for r, m in ranks.items()}
    )


def test_a_restart_is_one_line_naming_the_run_its_ranks_and_the_budget(capsys):
    policy = FailFastPolicy(FailureConfig(max_failures=1), "exp-1M")
    error = lost(r0="connection reset", r1="connection reset", r2="the actor died")
    assert policy.make_decision(error) == FailureDecision.RETRY
    assert capsys.readouterr().out == (
        "[exp-1M] ranks 0, 1: connection reset; rank 2: the actor died; Ray Train restarts the "
        "workers from the latest checkpoint (restart 1, ray.max_failures 1)\n"
    )
    # past the budget the run fails: the driver says so (train_driver.failure_message)
    assert policy.make_decision(lost(r0="the actor died")) == FailureDecision.RAISE
    assert capsys.readouterr().out == ""


def test_a_worker_that_stopped_answering_is_said_so_not_by_its_actor_id(capsys):
    """Ray's ActorUnavailableError (a node lost before Ray declared it dead) names the actor's id
    and says it is unavailable; the line says what that means. Ray Train hands it over inside
    its failed health check (a CI run of the two-node test printed Ray's words)."""
    unavailable = ActorUnavailableError("RpcError: connection refused", b"\x01" * 16)
    checked = WorkerHealthCheckFailedError("Worker health check failed", failure=unavailable)
    policy = FailFastPolicy(FailureConfig(max_failures=3), "exp-300K")
    policy.make_decision(WorkerGroupError("lost", {0: checked}))
    assert capsys.readouterr().out == (
        "[exp-300K] rank 0: its worker stopped answering (its node lost, or the network); Ray "
        "Train restarts the workers from the latest checkpoint (restart 1, ray.max_failures 3)\n"
    )


def test_an_unlimited_budget_is_said_so(capsys):
    policy = FailFastPolicy(FailureConfig(max_failures=-1), "run")
    policy.make_decision(lost(r0="the actor died"))
    assert capsys.readouterr().out.endswith("(restart 1, ray.max_failures -1: no limit)\n")


def test_workers_that_did_not_start_are_charged_to_the_controllers_budget(capsys):
    """A worker group that timed out starting is Ray Train's controller error, retried under its
    own limit (no limit by default), not ``ray.max_failures``; the count is per budget."""
    policy = FailFastPolicy(FailureConfig(max_failures=0), "exp-1M")
    assert policy.make_decision(ControllerError(WorkerGroupStartupTimeoutError(2))) == (
        FailureDecision.RETRY
    )
    out = capsys.readouterr().out
    assert out.startswith("[exp-1M] its workers did not start (The worker group startup timed out")
    assert out.endswith(
        "; Ray Train restarts the workers from the latest checkpoint (restart 1, Ray Train's "
        "controller_failure_limit -1: no limit)\n"
    )
    assert policy.make_decision(lost(r0="the actor died")) == FailureDecision.RAISE


def test_bad_input_stops_the_run_at_once_without_a_restart_line(capsys):
    policy = FailFastPolicy(FailureConfig(max_failures=3), "exp-1M")
    error = WorkerGroupError("failed", {0: FatalRunError("trainer.run_dir: not writable")})
    assert policy.make_decision(error) == FailureDecision.RAISE
    assert capsys.readouterr().out == ""
