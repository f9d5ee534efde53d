"""Ray Train controller callbacks that let a test act on one run at an exact step.

They run in the run's Ray Train controller, which knows the run's own worker group (each worker's
PID is in its actor metadata) and sees every report in order. So a test kills a worker of *its*
run, or holds its run at a step, without polling and without searching the machine's processes.

These are Ray Train's internal hooks (pinned Ray 2.60): the public ``UserCallback`` sees neither
the worker group nor the run's name. A driver in another process gets them from the environment
(``RAY_TRAIN_CALLBACKS``, read by every TorchTrainer it builds), see :class:`HoldRun`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import ray
from ray.train.v2._internal.execution.callback import (
    ControllerCallback,
    ReportCallback,
    WorkerGroupCallback,
)


class StepHook(ControllerCallback, WorkerGroupCallback, ReportCallback):
    """Calls :meth:`act` once, at the first report of step ``step`` or later of the run named
    ``run`` (any run when None). Appends a JSON line to ``log`` for every worker group the run
    starts (``{"workers": [pid of rank 0, pid of rank 1, ...]}``) and one for the action."""

    def __init__(self, log: str | Path, step: int, run: str | None = None):
        self.log = str(log)
        self.step = step
        self.run = run
        self.ours = run is None
        self.done = False
        self.pids: list[int] = []

    def after_controller_start(self, train_run_context) -> None:
        self.ours = self.run is None or train_run_context.run_config.name == self.run

    def after_worker_group_start(self, worker_group) -> None:
        if not self.ours:
            return
        workers = sorted(worker_group.get_workers(), key=lambda w: w.distributed_context.world_rank)
        self.pids = [w.metadata.pid for w in workers]
        self.record(workers=self.pids)

    def after_report(self, training_report, metrics) -> None:
        step = metrics[0].get("step", 0) if metrics else 0
        if self.ours and not self.done and step >= self.step:
            self.done = True
            self.act(step)

    def act(self, step: int) -> None:
        raise NotImplementedError

    def record(self, **entry) -> None:
        with open(self.log, "a") as f:
            f.write(json.dumps(entry) + "\n")


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class KillWorker(StepHook):
    """SIGKILLs the run's worker of world rank ``rank`` (no other process) at the step."""

    def __init__(self, log: str | Path, step: int, rank: int, run: str | None = None):
        super().__init__(log, step, run)
        self.rank = rank

    def act(self, step: int) -> None:
        pid = self.pids[self.rank]
        os.kill(pid, signal.SIGKILL)
        self.record(killed=pid, step=step)


HOLD_ENV = "RAYLADDER_TEST_HOLD"
"""``<run name>:<step>:<log path>`` for :class:`HoldRun`."""


class HoldRun(StepHook):
    """Holds the run at the step for good: records ``{"held": step}``, then never returns, so
    the run's workers stop at their next report and the run stays unfinished (its checkpoint
    of that step committed) until the test kills the driver that started it.

    For a driver in another process: ``RAY_TRAIN_CALLBACKS=ray_train_hooks.HoldRun``,
    :data:`HOLD_ENV` set, and this directory on ``PYTHONPATH`` (Ray's processes inherit all three).
    """

    def __init__(self):
        run, step, log = os.environ[HOLD_ENV].split(":", 2)
        super().__init__(log, int(step), run)

    def act(self, step: int) -> None:
        self.record(held=step)
        while True:
            time.sleep(3600)


RELEASE_ENV = "RAYLADDER_TEST_HOLD_UNTIL"
"""``<step>:<log path>:<release path>`` for :class:`HoldUntilReleased`."""


class HoldUntilReleased(StepHook):
    """Holds every run at its report of ``step`` until the file ``<release path>`` exists: a
    test acts while all runs are mid-way at a known point (takes a node away), then lets their
    controllers go on (and find out).

    Besides :class:`StepHook`'s lines, each run records ``{"run", "controller": <node id>}``
    (where its controller, so its trial driver, runs), ``{"run", "held": step}`` and, whenever
    its controller acts on a failure, ``{"run", "failure": <unix time>}``. For drivers on a
    cluster, the nodes' ``ray start`` environment sets
    ``RAY_TRAIN_CALLBACKS=ray_train_hooks.HoldUntilReleased``, :data:`RELEASE_ENV` and this
    directory on ``PYTHONPATH`` (Ray's processes inherit them from their node).
    """

    def __init__(self):
        step, log, self.release = os.environ[RELEASE_ENV].split(":", 2)
        super().__init__(log, int(step))
        self.name = ""

    def after_controller_start(self, train_run_context) -> None:
        self.name = train_run_context.run_config.name
        self.record(run=self.name, controller=ray.get_runtime_context().get_node_id())

    def act(self, step: int) -> None:
        self.record(run=self.name, held=step)
        while not os.path.exists(self.release):
            time.sleep(0.1)

    def before_controller_execute_failure_decision(self, failure_decision) -> None:
        self.record(run=self.name, failure=time.time())


KILL_ENV = "RAYLADDER_TEST_KILL"
"""``<run name>:<step>:<rank>:<log path>`` for :class:`KillWorkerFromEnv`."""


class KillWorkerFromEnv(KillWorker):
    """:class:`KillWorker` for a driver in another process (configured like :class:`HoldRun`,
    through :data:`KILL_ENV`)."""

    def __init__(self):
        run, step, rank, log = os.environ[KILL_ENV].split(":", 3)
        super().__init__(log, int(step), int(rank), run)


FAILURES_ENV = "RAYLADDER_TEST_FAILURES"
"""The file :class:`CountFailures` appends to when built with no path (from ``RAY_TRAIN_CALLBACKS``)."""


class CountFailures(ControllerCallback):
    """Appends a line per failed worker-group attempt (the controller's decision on it: RETRY or
    RAISE) to ``path`` (default: :data:`FAILURES_ENV`). A controller hook, not a ``UserCallback``,
    so it also works when the driver builds it from ``RAY_TRAIN_CALLBACKS``."""

    def __init__(self, path: str | Path | None = None):
        self.path = str(path or os.environ[FAILURES_ENV])

    def before_controller_execute_failure_decision(self, failure_decision) -> None:
        with open(self.path, "a") as f:
            f.write(f"{failure_decision}\n")
