"""Ray Tune over training runs: one trial per run (ladder sizes, or size x LR for sweeps).

Ray 2.60 (Train V2) pattern: each Tune trial is a small *driver* function that builds a
TorchTrainer and fits it; a ``TuneReportCallback`` forwards rank 0's reports to Tune. Run names
come from the plan, not from Tune, so a restored experiment (``--resume``) or a relaunch into
its dir finds each run dir again: ended runs (finished, diverged, stopped early) return at once,
unfinished ones resume from their latest checkpoint. When every run has ended, neither Ray nor
Tune is started: the relaunch only reports.

Ray Tune and the training path are imported inside the functions that run trials: planning
(``--dry-run``, ``--help``) imports this module for :class:`TrialSpec` without paying for them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from trainer_core.config.cli import planned_from
from trainer_core.config.loader import ConfigError
from trainer_core.errors import UserError
from trainer_core.io import storage
from trainer_core.io.run_dir import (
    FINAL_STATUSES,
    TUNE,
    mark_failed,
    mark_interrupted,
    mark_stopped,
    metrics_path,
    read_run_json,
)
from trainer_core.io.sigterm import sigterm_as_ctrl_c
from trainer_core.io.storage import Location
from trainer_core.ray.failures import last_line, unretriable_error, user_error_in
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.train.same_run import ChangedRunError, check_same_run

if TYPE_CHECKING:
    from trainer_core.ray.node_view import DriverView

T = TypeVar("T")

DRIVER_SHARE = 0.001
"""Of its node's own ``node:<ip>`` resource, per trial driver: up to 1000 at once per node."""
NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray gives every node, its node id."""
TRIAL_END_STATUSES = (*FINAL_STATUSES, "stopped")
"""A trial whose run is in one of these is done. Early stopping's end is a trial's result, as
a finished run is: trained on by a relaunch into the experiment's dir, it would move the
sweep's optimum and widening rounds. (``python -m trainer_core.train`` on that run's dir still
resumes it: a single run knows no scheduler.)"""


class TrialsFailedError(UserError, RuntimeError):
    """Some trials ended in an error: the experiment is incomplete, whatever the others did."""


class TrialsInterruptedError(UserError, RuntimeError):
    """The experiment was interrupted (Ctrl+C) with runs unfinished; what ran is kept."""


@dataclass
class TrialSpec:
    """One planned run: its name, full config and the tags analysis groups by."""

    name: str
    config: RayTrainConfig
    tags: dict[str, Any] = field(default_factory=dict)

    def as_param(self) -> dict[str, Any]:
        """The trial's Tune param; the config goes as the object (Ray pickles it)."""
        return {"name": self.name, "train": self.config, "tags": self.tags}


def trial_driver(config: dict[str, Any], driver_view: DriverView | None = None) -> None:
    """The Tune trainable: run (or resume) one run, by its runner (``ray.runner``), and report
    its final summary; a run that already ended (:data:`TRIAL_END_STATUSES`) reports its record
    at once, so a relaunched experiment trains only what it never ended. ``driver_view``: what
    the experiment's driver sees, checked first (a trial may run on another node)."""
    started_at = time.time()
    from ray import tune

    from trainer_core.ray.node_view import check_node_sees
    from trainer_core.ray.train_driver import run_summary

    spec = config["trial"]
    cfg: RayTrainConfig = spec["train"]
    _unretried(check_node_sees, driver_view)
    summary = run_summary(cfg.trainer.run_location)
    if summary.get("status") not in TRIAL_END_STATUSES:  # the driver said so for those
        summary = _train(cfg, spec["tags"], started_at, summary)
    final = {
        k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    final["diverged"] = int(summary.get("status") == "diverged")
    final["finished"] = 1
    tune.report(final)


def _train(
    cfg: RayTrainConfig, tags: dict[str, Any], started_at: float, done: dict[str, Any]
) -> dict[str, Any]:
    """Run (or resume) ``cfg`` by its runner; its summary (``done``: the one read before)."""
    return _unretried(_run, cfg, tags, started_at, done)


def _unretried(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, where a user error (bad input, a Ray Train worker group out of restarts)
    tells Tune not to retry: a retry would only repeat it; a lost controller is the one run
    failure a retry resumes."""
    from ray import tune

    from trainer_core.ray.trial_runner import NO_RETRY

    try:
        return fn(*args)
    except Exception as e:
        if unretriable_error(e) is not None:
            tune.report({NO_RETRY: 1})
        raise


def _run(
    cfg: RayTrainConfig, tags: dict[str, Any], started_at: float, done: dict[str, Any]
) -> dict[str, Any]:
    if cfg.ray.runner == "trial":
        from trainer_core.ray.trial_runner import run_in_trial

        return run_in_trial(cfg, tags, started_at)
    from ray.tune.integration.ray_train import TuneReportCallback

    from trainer_core.ray.train_driver import run_training

    return run_training(cfg, tags, callbacks=[TuneReportCallback()], done=done)


def driver_resources():
    """Each trial driver's resources: a place on the Tune driver's node, no CPU.

    A trial driver hosts its run's Ray Train controller (Ray puts the controller on the node of
    the process that calls ``fit``). Left to Tune, drivers land on any node, and losing that node
    errors the trial where Ray Train would have restarted its workers elsewhere; the Tune
    driver's node is the one whose survival is assumed (its loss is ``--resume``'s). No CPU: a
    driver only waits on its controller, and a head started with ``--num-cpus=0`` (as Ray advises
    for large clusters) must still take them. So the bundle holds a sliver of the node's own
    ``node:<ip>`` resource, and the label selector picks the node by id, exact even where
    several nodes share an IP.
    """
    import ray
    from ray import tune

    node_id = ray.get_runtime_context().get_node_id()
    (node,) = [n for n in ray.nodes() if n["NodeID"] == node_id]
    return tune.PlacementGroupFactory(
        [{f"node:{node['NodeManagerAddress']}": DRIVER_SHARE}],
        bundle_label_selector=[{NODE_ID_LABEL: node_id}],
    )


@dataclass
class TuneSettings:
    metric: str = "eval/loss"
    mode: str = "min"
    scheduler: Any = None
    max_concurrent: int = 0
    """0: as many trials at once as the cluster's CPUs/GPUs hold worker groups."""
    name: str = TUNE
    """The Tune experiment's dir under the experiment dir (an LR sweep's widening rounds)."""
    callbacks: list = field(default_factory=list)
    """More Tune callbacks (``ray.tune.Callback``): a progress display, a test's fault injection."""


def costliest_first(plans: list) -> list:
    """Plans by total FLOPs, largest first: with several trials at once, the short ones then
    fill the slots that free up at the end instead of a long one running alone (LPT order)."""
    return sorted(plans, key=lambda p: p.total_flops, reverse=True)


def max_concurrent_trials(specs: list[TrialSpec]) -> int:
    """How many of the widest trial's footprints fit in the cluster right now.

    A Ray Train trial holds its workers and (while streaming) one Ray Data read task per worker;
    reserving both keeps read tasks from starving behind the workers (a hang). Its driver takes
    no CPU. A trial-runner trial is its one worker.
    """
    import ray

    from trainer_core.ray.reader import READ_TASK_CPUS

    res = ray.cluster_resources()
    rc = max(specs, key=lambda s: s.config.ray.num_workers).config.ray
    streams = rc.runner == "train" and rc.reader == "ray_data"
    cpus = rc.num_workers * (rc.cpus_per_worker + (READ_TASK_CPUS if streams else 0))
    fits = [res.get("CPU", 1) // cpus]
    if rc.use_gpu:
        fits.append(res.get("GPU", 0) // (rc.num_workers * rc.gpus_per_worker))
    return max(1, int(min(fits)))


@dataclass
class TrialsRun:
    """What :func:`run_trials` did: Tune's ResultGrid, trials at once, and ``fit``'s wall time.
    ``grid`` is None when every run had ended before (:meth:`all_ended`): Tune did not start."""

    grid: Any
    concurrency: int
    wall_s: float
    restored: bool = False
    """Resumed an earlier experiment: trial times then include that session's."""
    ended_before: int = 0
    """Runs that had ended before this launch (each reports its record, trains no more)."""

    @classmethod
    def all_ended(cls, runs: int) -> TrialsRun:
        return cls(grid=None, concurrency=0, wall_s=0.0, ended_before=runs)

    def concurrency_report(self) -> str:
        """Wall time against the ideal: the sum of trial times spread over the concurrent slots.

        The wall is Tune's own (first trial scheduled to last one done); connecting to or
        starting Ray comes before it and is not the sweep's cost.
        """
        if self.grid is None:
            runs = f"{self.ended_before} run{'s' * (self.ended_before != 1)}"
            return (
                f"{runs}, each ended before this launch: nothing trained, Ray and Tune not started"
            )
        times = [r.metrics.get("time_total_s", 0.0) for r in self.grid if r.metrics]
        if self.restored:
            return (
                f"{len(times)} trials, {self.concurrency} at a time, this session's wall "
                f"{self.wall_s:.0f} s (resumed: no ideal-time comparison, trial times span sessions)"
            )
        ideal = sum(times) / self.concurrency
        return (
            f"{len(times)} trials, {self.concurrency} at a time: sum of trial times "
            f"{sum(times):.0f} s, ideal wall {ideal:.0f} s, actual wall {self.wall_s:.0f} s "
            f"({self.wall_s / max(ideal, 1e-9):.2f}x ideal)"
        )


def ended_runs(specs: list[TrialSpec]) -> list[str]:
    """A line for each spec whose run already ended, named as its training lines were: its
    trial reports that record and trains no more. Said by the driver before Tune starts: a
    trial's own print reaches the driver's stdout whenever Ray's log monitor gets to it, in the
    middle of the report's lines."""
    lines = []
    for spec in specs:
        record = read_run_json(spec.config.trainer.run_location) or {}  # not its metrics
        if record.get("status") in TRIAL_END_STATUSES:
            lines.append(
                f"[{record.get('name', spec.name)}] {record['status']} before at step "
                f"{record.get('last_step')}: not trained again"
            )
    return lines


def run_trials(
    specs: list[TrialSpec], exp_dir: Location, settings: TuneSettings, resume: bool
) -> TrialsRun:
    """Run every spec as a Tune trial (or restore the experiment) under ``exp_dir``, as its
    config made it canonical (``LadderConfig.exp_dir``), on the Ray its ``ray.address`` names
    (started or joined here). Tune keeps its state in ``<exp_dir>/<settings.name>``, on object
    storage too (Ray reads a URL through pyarrow, with the same credential chain). Every run
    ended before: nothing starts (a relaunch to see the report again takes seconds)."""
    from ray import tune
    from ray.tune.logger import JsonLoggerCallback

    from trainer_core.ray.node_view import data_inputs, driver_view
    from trainer_core.ray.runtime import init_ray

    ended = ended_runs(specs)
    for line in ended:
        print(line, flush=True)
    if len(ended) == len(specs):
        return TrialsRun.all_ended(len(specs))
    init_ray(specs[0].config.ray.address)
    # one read of each data setting, not one per trial (a sweep's trials share theirs)
    data = {(s.config.data.mix, s.config.data.shards): s.config.data for s in specs}
    inputs = {i for cfg in data.values() for i in data_inputs(cfg)}
    view = driver_view(exp_dir, "dir", sorted(inputs, key=str))
    trainable, failure, callbacks, reuse = _trial_setup(specs, view)
    tune_dir = storage.join(exp_dir, settings.name)
    concurrency = settings.max_concurrent or max_concurrent_trials(specs)
    restored = resume and tune.Tuner.can_restore(str(tune_dir))
    # The grid again on a restore: Tune saved each spec as a placeholder, and trials the
    # interrupt left unstarted got the placeholder, not their spec, as their config.
    grid_space = {"trial": tune.grid_search([s.as_param() for s in specs])}
    if restored:
        tuner = tune.Tuner.restore(
            str(tune_dir),
            trainable=trainable,
            resume_unfinished=True,
            resume_errored=True,
            param_space=grid_space,
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=grid_space,
            tune_config=tune.TuneConfig(
                metric=settings.metric,
                mode=settings.mode,
                scheduler=settings.scheduler,
                max_concurrent_trials=concurrency,
                reuse_actors=reuse,
                trial_name_creator=_trial_name,
                trial_dirname_creator=_trial_name,
            ),
            run_config=tune.RunConfig(
                name=settings.name,
                storage_path=str(exp_dir),
                verbose=0,
                failure_config=failure,
                # Each trial's result.json, so the ResultGrid loaded later has its metrics
                # (RAY_ENV turns off Tune's default loggers, TensorBoard among them).
                callbacks=[JsonLoggerCallback(), *callbacks, *settings.callbacks],
            ),
        )
    started = time.perf_counter()
    with sigterm_as_ctrl_c():  # here: after ray.init, which sets a SIGTERM handler of its own
        grid = tuner.fit()
    wall_s = time.perf_counter() - started
    # Tune returns from a Ctrl+C as from a finished experiment (its running trials marked
    # terminated): only a trial's last result says whether it ended (``done``, set too when a
    # scheduler stopped it) or was cut off; an interrupted run must not be recorded as stopped.
    cut_off = {
        storage.name(r.path) for r in grid if r.error is None and not (r.metrics or {}).get("done")
    }
    unfinished = len(specs) - len(grid) + len(cut_off)
    if unfinished:
        record_interrupts(specs, cut_off)
        raise TrialsInterruptedError(
            f"interrupted with {unfinished} of {len(specs)} runs unfinished; finished runs, "
            f"checkpoints and metrics are kept in {exp_dir}: re-run the same command with "
            "--resume to go on"
        )
    failed = trial_failures(grid)
    record_trial_ends(specs, failed, lost_trials(grid))
    if failed:
        lines = "\n".join(f"  {name}: {reason}" for name, reason in failed.items())
        raise TrialsFailedError(
            f"{len(failed)} of {len(specs)} runs failed:\n{lines}\nfinished runs, checkpoints "
            f"and metrics are kept in {exp_dir}; fix the cause and re-run the same command "
            "with --resume (finished runs are not trained again)"
        )
    return TrialsRun(grid, concurrency, wall_s, restored)


def check_unchanged_runs(
    specs: list[TrialSpec], planned: Mapping[str, str], dir_key: str = "dir"
) -> None:
    """Refuse, as one line before anything is written or started, specs whose run dirs hold a
    run trained with other settings (:func:`~trainer_core.train.same_run.check_same_run`): a
    relaunch into an experiment's dir would otherwise resume or report that run as this one.
    Worded in the experiment's keys (``lr``, not the run's ``optim.lr``; ``planned``: the job's
    :meth:`~trainer_core.ladder.config.LadderConfig.planned`), with its remedy."""
    for spec in specs:
        try:
            check_same_run(spec.config, spec.config.trainer.run_location)
        except ChangedRunError as e:
            keys = ", ".join(
                dict.fromkeys(planned_from(k, planned) or f"run.{k}" for k in e.changed)
            )
            raise ConfigError(
                f"{dir_key}: {e.path} records run {spec.name} trained with other {keys}; going "
                "on would keep its weights under the new settings: launch the changed config "
                f"into a new --{dir_key}, or undo the change"
            ) from None


def _trial_setup(specs: list[TrialSpec], view: DriverView):
    """The trainable with its resources and the driver's ``view``, Tune's failure config, extra
    callbacks and whether trials reuse a finished trial's process, by the trials' runner (one
    for all: they come from one job).

    Tune retries a failed trial up to ``ray.max_failures`` times, except one that failed on
    bad input (:class:`~trainer_core.ray.trial_runner.NoRetryOnUserError`); a retry resumes the
    run from its latest checkpoint (:func:`trial_driver` is idempotent). A trial-runner trial
    is the worker, so Tune's restarts are the run's. A Ray Train trial restarts its own lost
    workers; Tune retries it when its driver or Ray Train controller is lost, but not once its
    worker group is out of restarts (``RayConfig.max_failures`` says how the two budgets add
    up). A trial-runner trial's process (torch imported, about 5 s a trial on 2 cores) goes to
    the next trial: a finished trial's thread has returned, and a trial stopped early is
    parked in its last report until Tune releases it to exit (a Ray Train trial's thread is in
    ``fit()`` and would not end).
    """
    from ray import tune

    from trainer_core.ray.trial_runner import NoRetryOnUserError, trial_resources

    (rc,) = {s.config.ray.runner: s.config.ray for s in specs}.values()
    in_trial = rc.runner == "trial"
    resources = trial_resources(rc) if in_trial else driver_resources()
    return (
        tune.with_resources(tune.with_parameters(trial_driver, driver_view=view), resources),
        tune.FailureConfig(max_failures=rc.max_failures),
        [NoRetryOnUserError(), retry_line()],
        in_trial,
    )


def retry_line():
    """A Tune callback that prints one line when Tune retries a failed trial: Tune's own report
    of the failure, a traceback, is filtered out (:data:`trainer_core.ray.runtime.TRIAL_ERRORS`)."""
    from ray import cloudpickle, tune

    class RetryLine(tune.Callback):
        def on_trial_recover(self, iteration, trials, trial, **info) -> None:
            # the local copy: the one in the experiment's storage is synced later
            path = trial.pickled_error_file
            why = f"see {trial.error_file}"
            if path and os.path.exists(path):
                with open(path, "rb") as f:
                    why = error_line(cloudpickle.load(f))
            print(
                f"[{_trial_name(trial)}] trial failed ({why}); retrying it from its latest "
                f"checkpoint (retry {trial.num_failures}"
                f"{f' of {trial.max_failures}' if trial.max_failures >= 0 else ', no limit'})",
                flush=True,
            )

    return RetryLine()


def trial_failures(grid) -> dict[str, str]:
    """Run name -> why its trial errored, in one line (the user error's message when there is
    one, else the last line of Ray's report)."""
    failed = {}
    for result in grid:
        if result.error is None:
            continue
        # Named by its trial dir (the run's name): a trial that never reported has no config.
        failed[storage.name(result.path)] = error_line(result.error)
    return failed


def error_line(error: BaseException) -> str:
    """A trial's error in one line: the user error's first line when there is one, else the
    last line of Ray's report."""
    found = user_error_in(error)
    if found is None:
        return last_line(getattr(error, "cause", None) or error)
    return next(
        (line.strip() for line in str(found).splitlines() if line.strip()), type(found).__name__
    )


def _trial_name(trial) -> str:
    return trial.config["trial"]["name"]


def lost_trials(grid) -> set[str]:
    """The runs whose trials failed for no error a retry would repeat (:func:`unretriable_error`):
    a process or controller lost, nothing of the run left to record it (a user error is
    recorded, or a refused launch left as it was, where raised)."""
    return {
        storage.name(r.path)
        for r in grid
        if r.error is not None and unretriable_error(r.error) is None
    }


def record_trial_ends(specs: list[TrialSpec], failed: Mapping[str, str], lost: set[str]) -> None:
    """Runs whose trials ended but still say "running": stopped by Tune's scheduler, or
    ``lost`` with no retry left (:func:`lost_trials`), recorded failed with ``failed``'s line."""
    for spec in specs:
        if spec.name in lost:
            mark_failed(spec.config.trainer.run_dir, failed[spec.name])
        elif spec.name not in failed:
            mark_stopped(spec.config.trainer.run_dir)


def record_interrupts(specs: list[TrialSpec], cut_off: set[str]) -> None:
    """Runs whose trials an interrupt ``cut_off`` (by trial dir, the run's name) that still say
    "running" (left at their start's step 0), recorded ``interrupted`` at their last logged
    step, as a run interrupted without Ray records itself: Tune ends a trial before its ranks
    can. Only once ``fit`` has returned and the runs' metrics have stopped growing: Tune has
    stopped every trial by then, but a Ray Train run's workers die after their trial's
    controller, and logged 3 more steps once on a loaded machine. The runs are watched together,
    by their metrics' size (one stat, or one HEAD request on object storage, per look), so
    K runs wait as long as one; each run's metrics are read whole once, when it is recorded. A
    spec Tune made no trial of this session is left as it is: this session did not run it."""
    run_dirs = [spec.config.trainer.run_dir for spec in specs if spec.name in cut_off]
    _until_all_still([partial(_metrics_size, d) for d in run_dirs], quiet_s=1.0, limit_s=10.0)
    for run_dir in run_dirs:
        mark_interrupted(run_dir)


def _metrics_size(run_dir: Location) -> int | None:
    """The size of a run's ``metrics.jsonl`` (None: not written yet)."""
    try:
        return storage.size(metrics_path(run_dir))
    except FileNotFoundError:
        return None


@dataclass
class _Watched:
    """A value :func:`_until_all_still` waits on: what it last read, and since when."""

    value: Callable[[], object]
    last: object
    since: float


def _until_all_still(
    values: Sequence[Callable[[], object]], quiet_s: float, limit_s: float, poll_s: float = 0.1
) -> None:
    """Wait until each of ``values`` has not changed for ``quiet_s`` seconds, or until
    ``limit_s`` passed, for all of them together: one deadline, not one per value. A value
    found still is not read again."""
    deadline = time.monotonic() + limit_s
    moving = [_Watched(value, value(), time.monotonic()) for value in values]
    while True:
        now = time.monotonic()
        moving = [w for w in moving if now - w.since < quiet_s]
        if not moving or now >= deadline:
            return
        time.sleep(poll_s)
        for w in moving:
            current = w.value()
            if current != w.last:
                w.last, w.since = current, time.monotonic()


def fmt_lr(lr: float) -> str:
    exponent = math.floor(math.log10(lr))
    return f"{lr / 10**exponent:.3f}e{exponent}"
