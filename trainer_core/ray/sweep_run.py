"""Hyperparameter sweeps on Ray Tune: the size x batch x LR trials that
``trainer_core.ladder.sweep`` plans (at one or more token horizons), run on the ladder's trial
machinery with early stopping.

ASHA (or median stopping) on eval loss at the eval points frees the resources of clearly worse
trials, comparing only trials of one size and run length, at equal tokens. Where a group's best
trial is at the edge of its grid (in LR, or in batch) the sweep adds rounds of trials beyond that
edge (``sweep.widen_rounds``), each a Tune experiment of its own beside the first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd

from trainer_core.config.decode import repeated
from trainer_core.config.loader import ConfigError
from trainer_core.io import storage
from trainer_core.io.run_dir import WIDEN
from trainer_core.io.storage import Location
from trainer_core.ladder.plan import named_run
from trainer_core.ladder.record import write_experiment_record
from trainer_core.ladder.sweep import (
    SweepConfig,
    SweepRun,
    at_batch,
    plan_sweep,
    sweep_lrs,
    trial_config,
)
from trainer_core.ray.ladder_run import LadderJobConfig, on_ray
from trainer_core.ray.tune_run import (
    TrialSpec,
    TrialsRun,
    TuneSettings,
    check_unchanged_runs,
    fmt_lr,
    run_trials,
)

TIME_ATTR = "tokens"
"""Early stopping's clock: trials of different batches are compared at equal tokens (at equal
steps a larger batch would be ahead by its extra data)."""


@dataclass
class SweepJobConfig(LadderJobConfig):
    """A ladder's sizes and runs, swept: every size at each LR (and batch) of the grid, to fit
    LR*(N) (and B*) before the ladder trains."""

    sweep: SweepConfig = field(default_factory=SweepConfig)


def as_sweep(job: SweepJobConfig) -> SweepJobConfig:
    """The job with the sweep's own dir and name: the ladder's dir holds the ladder's runs."""
    return replace(job, dir=job.sweep.dir or f"{job.dir}-lr-sweep", name=f"{job.name}-lr-sweep")


def sweep_plans(job: SweepJobConfig, sizes: list[str] | None) -> list[SweepRun]:
    return plan_sweep(job, job.sweep, sizes)


def trial_spec(job: SweepJobConfig, run: SweepRun, lr: float, round_: int = 0) -> TrialSpec:
    """One size x run length x batch x LR trial; ``round_`` > 0: added by widening the grid."""
    plan = run.plan
    name = f"{run.trial_stem}{fmt_lr(lr)}"
    tags = {
        "sweep": job.name,
        "size": plan.size,
        "group": run.group,
        "lr_factor": lr / plan.lr,
        "round": round_,
    }
    cfg = named_run(trial_config(plan, job.sweep, lr), job, name)
    return TrialSpec(name=name, config=on_ray(cfg, plan, job, sweep=True), tags=tags)


def _ordered(
    trials: list[tuple[SweepRun, float]], runs: list[SweepRun]
) -> list[tuple[SweepRun, float]]:
    """Costliest groups first (LPT: short trials then fill the slots that free up at the end),
    and within a group the planned batch and formula LR first, then outwards: asynchronous early
    stopping can only stop a trial that reaches a rung after better ones did."""
    cost: dict[str, float] = {}
    planned: dict[str, int] = {}
    for run in runs:
        cost[run.group] = max(cost.get(run.group, 0.0), run.total_flops)
        planned.setdefault(run.group, run.plan.batch_tokens)

    def key(trial: tuple[SweepRun, float]) -> tuple[float, str, float]:
        run, lr = trial
        spread = abs(math.log(lr / run.plan.lr))
        spread += abs(math.log(run.plan.batch_tokens / planned[run.group]))
        return (-cost[run.group], run.group, spread)

    return sorted(trials, key=key)


def sweep_trials(job: SweepJobConfig, runs: list[SweepRun]) -> list[TrialSpec]:
    """Every size x run length x batch x LR trial, in :func:`_ordered`'s order."""
    seed = job.run.trainer.seed
    trials = [(run, lr) for run in runs for lr in sweep_lrs(run.plan, job.sweep, seed)]
    specs = [trial_spec(job, run, lr) for run, lr in _ordered(trials, runs)]
    twice = repeated([spec.name for spec in specs])
    if twice:
        raise ConfigError(
            f"sweep.factors / sweep.batch_factors: {len(twice)} trials share a name with another "
            f"(e.g. {twice[0]}), so they would share a run dir; make the factors distinct (a "
            "name shows an LR to 4 significant digits)"
        )
    return specs


def widening_trials(
    job: SweepJobConfig, runs: list[SweepRun], exp_dir: Location, round_: int
) -> list[TrialSpec]:
    """The trials beyond the grid's edge that the earlier rounds' results call for (none: every
    group's best trial is interior in LR and in batch). Later rounds' runs already on disk (a
    resumed sweep) are left out, so a round is the same whether it runs now or is restored."""
    from trainer_core.analysis import (
        hparam_table,
        load,
        lr_sweep_table,
        widen_horizons,
        widen_sweep,
    )

    results = load(exp_dir)
    rounds = results.runs.set_index("name").get("tag_round", pd.Series(dtype=float))
    earlier = results.runs["name"].map(rounds).fillna(0) < round_
    table = lr_sweep_table(results)
    table = table[table["name"].map(rounds).fillna(0) < round_]
    points = hparam_table(results)
    points = points[points["name"].isin(table["name"])]
    trials = [
        (_run_at(runs, group, batch), lr)
        for wanted in (widen_sweep(table), widen_horizons(points, table))
        for group, beyond in wanted.items()
        for lr, batch in beyond
    ]
    specs = [trial_spec(job, run, lr, round_) for run, lr in _ordered(trials, runs)]
    # A batch beyond the edge can round back to one tried: that run is already on disk; and
    # the final horizon and an earlier one can ask for the same trial.
    tried = {storage.name(d) for d in results.runs.loc[earlier, "dir"]}
    return list({s.name: s for s in specs if s.name not in tried}.values())


def _run_at(runs: list[SweepRun], group: str, batch: int) -> SweepRun:
    """The group's run at ``batch`` tokens: a planned one, or the group re-planned for it."""
    members = [r for r in runs if r.group == group]
    for run in members:
        if run.plan.batch_tokens == batch:
            return run
    return at_batch(members[0].ladder, members[0].plan.size, batch)


def _tokens(spec: TrialSpec) -> int:
    return spec.config.total_steps * spec.config.trainer.global_batch_size


def early_stopper(job: SweepJobConfig, specs: list[TrialSpec]):
    """ASHA or median stopping per group (one size and run length), clocked in tokens: the
    first rung at the group's earliest first eval, the last at its longest run."""
    from ray.tune.schedulers import ASHAScheduler, MedianStoppingRule

    from trainer_core.ray.early_stopping import GroupedScheduler

    def for_group(members: list[TrialSpec]):
        grace = min(
            s.config.trainer.eval_interval * s.config.trainer.global_batch_size for s in members
        )
        if job.sweep.early_stopping == "asha":
            return ASHAScheduler(
                time_attr=TIME_ATTR,
                max_t=max(_tokens(s) for s in members),
                grace_period=grace,
                reduction_factor=job.sweep.reduction_factor,
            )
        return MedianStoppingRule(time_attr=TIME_ATTR, grace_period=grace, min_samples_required=3)

    if job.sweep.early_stopping == "none":
        return None
    groups: dict[str, list[TrialSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.tags["group"], []).append(spec)
    return GroupedScheduler({g: for_group(members) for g, members in groups.items()})


def run_sweep(
    job: SweepJobConfig, runs: list[SweepRun], specs: list[TrialSpec], resume: bool
) -> list[TrialsRun]:
    """Check and run the planned trials (``specs``: :func:`sweep_trials` of the
    :func:`sweep_plans` ``runs`` of ``job``, already :func:`as_sweep`, after ``preflight``), then
    the widening rounds; one TrialsRun per round that ran.

    Round k's Tune state is ``tune-widen<k>/``; a resumed sweep recomputes each round's trials
    from the results on disk, so it restores the same rounds.
    """
    check_unchanged_runs(specs, job.planned(), "sweep.dir")
    exp_dir = job.exp_dir
    write_experiment_record(job, [r.plan for r in runs], exp_dir, resume)
    at_once = job.ray.max_concurrent_trials
    first = TuneSettings(scheduler=early_stopper(job, specs), max_concurrent=at_once)
    done = [run_trials(specs, exp_dir, first, resume)]
    for round_ in range(1, job.sweep.widen_rounds + 1):
        specs = widening_trials(job, runs, exp_dir, round_)
        if not specs:
            break
        added = ", ".join(
            f"{s.tags['group']} lr {s.config.optim.lr:.3e} batch {s.config.trainer.global_batch_size}"
            for s in specs
        )
        print(f"widening the grid, round {round_}: a best trial at an edge; adding {added}")
        check_unchanged_runs(specs, job.planned(), "sweep.dir")
        settings = TuneSettings(
            scheduler=early_stopper(job, specs), max_concurrent=at_once, name=f"{WIDEN}{round_}"
        )
        done.append(run_trials(specs, exp_dir, settings, resume))
    return done
