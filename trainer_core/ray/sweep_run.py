"""Learning-rate sweeps: size x peak-LR trials on the ladder's trial machinery, with early stopping.

Each size's LRs are log-spaced multiples of the ladder formula's LR (or log-uniform random draws);
runs are short by default (a fraction of the ladder's duration, the schedule compressed with it).
ASHA (or median stopping) on eval loss at the eval steps frees the resources of clearly worse LRs.
A size whose best LR is at the edge of its grid gets more rounds of trials beyond that edge
(``sweep.widen_rounds``), each a Tune experiment of its own beside the first.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import pandas as pd

from trainer_core.config import require
from trainer_core.ladder import SizePlan, named_run, plan_ladder
from trainer_core.ray.ladder_run import (
    LadderJobConfig,
    on_ray,
    preflight,
    write_experiment_record,
)
from trainer_core.ray.tune_run import (
    TrialSpec,
    TrialsRun,
    TuneSettings,
    costliest_first,
    fmt_lr,
    run_trials,
)


@dataclass
class SweepConfig:
    search: Literal["grid", "random"] = "grid"
    factors: list[float] = field(default_factory=lambda: [2.0**k for k in range(-3, 4)])
    """Grid: multiples of the ladder's formula LR."""
    num_samples: int = 8
    """Random: LRs per size, log-uniform in [min(factors), max(factors)] x formula LR."""
    duration_multiple: float = 0.25
    """Chinchilla multiple c of each sweep run, at most the ladder's own c (full_length: the ladder's)."""
    full_length: bool = False
    early_stopping: Literal["asha", "median", "none"] = "asha"
    grace_fraction: float = 0.25
    """ASHA's first rung, as a fraction of the run's steps; also the sweep runs' eval interval
    (in place of ``run.trainer.eval_interval``), so every rung sees an eval loss."""
    reduction_factor: int = 2
    widen_rounds: int = 2
    """Rounds of extra trials beyond the edge of the grid while a size's best LR is at an edge
    (one LR a round, a grid step further out; 0: never widen)."""
    dir: str = ""
    """Where the sweep writes; empty: beside the ladder's dir, ``<dir>-lr-sweep``, so one config
    serves the sweep and then the ladder (feed it back with ``lr.from_sweep``)."""

    def __post_init__(self) -> None:
        require(
            bool(self.factors) and min(self.factors) > 0,
            "factors",
            self.factors,
            "must be positive",
        )
        require(self.num_samples >= 1, "num_samples", self.num_samples, "must be >= 1")
        require(
            0 < self.grace_fraction <= 1, "grace_fraction", self.grace_fraction, "must be in (0, 1]"
        )
        require(
            self.reduction_factor >= 2, "reduction_factor", self.reduction_factor, "must be >= 2"
        )
        require(self.widen_rounds >= 0, "widen_rounds", self.widen_rounds, "must be >= 0")


@dataclass
class SweepJobConfig(LadderJobConfig):
    sweep: SweepConfig = field(default_factory=SweepConfig)


def as_sweep(job: SweepJobConfig) -> SweepJobConfig:
    """The job with the sweep's own dir and name: the ladder's dir holds the ladder's runs."""
    return replace(job, dir=job.sweep.dir or f"{job.dir}-lr-sweep", name=f"{job.name}-lr-sweep")


def sweep_lrs(plan: SizePlan, sweep: SweepConfig, seed: int) -> list[float]:
    """The size's LRs, centre out (nearest the formula first).

    Asynchronous early stopping can only stop a trial that reaches a rung after better ones
    did; starting from the likely optimum gives the extremes something to lose against.
    """
    if sweep.search == "grid":
        factors = list(sweep.factors)
    else:
        rng = random.Random(f"{seed}-{plan.size}")
        lo, hi = math.log(min(sweep.factors)), math.log(max(sweep.factors))
        factors = [math.exp(rng.uniform(lo, hi)) for _ in range(sweep.num_samples)]
    return [plan.lr * f for f in sorted(factors, key=lambda f: (abs(math.log(f)), f))]


def rung_steps(plan: SizePlan, sweep: SweepConfig) -> int:
    """Eval (and report) interval: ASHA's first rung, so every rung sees an eval loss."""
    return max(1, round(sweep.grace_fraction * plan.steps))


def sweep_plans(job: SweepJobConfig, sizes: list[str] | None) -> list[SizePlan]:
    if not job.sweep.full_length:
        multiple = min(job.sweep.duration_multiple, job.duration.chinchilla_multiple)
        job = replace(
            job,
            duration=replace(job.duration, chinchilla_multiple=multiple, multiple_by_size={}),
        )
    return plan_ladder(job, sizes)


def trial_spec(job: SweepJobConfig, plan: SizePlan, lr: float, round_: int = 0) -> TrialSpec:
    """One size x LR trial; ``round_`` > 0: a trial added by widening the grid."""
    name = f"{plan.size}-lr{fmt_lr(lr)}"
    tags = {"sweep": job.name, "size": plan.size, "lr_factor": lr / plan.lr, "round": round_}
    cfg = plan.config
    cfg = replace(
        cfg,
        optim=replace(cfg.optim, lr=lr),
        trainer=replace(cfg.trainer, eval_interval=rung_steps(plan, job.sweep)),
    )
    return TrialSpec(name=name, config=on_ray(named_run(cfg, job, name), plan, job), tags=tags)


def sweep_trials(job: SweepJobConfig, plans: list[SizePlan]) -> list[TrialSpec]:
    """Every size x LR trial: sizes costliest first, each size's LRs centre out."""
    return [
        trial_spec(job, plan, lr)
        for plan in costliest_first(plans)
        for lr in sweep_lrs(plan, job.sweep, job.run.trainer.seed)
    ]


def widening_trials(
    job: SweepJobConfig, plans: list[SizePlan], exp_dir: Path, round_: int
) -> list[TrialSpec]:
    """The trials beyond the grid's edge that the earlier rounds' results call for (none: every
    best LR is interior). Later rounds' runs already on disk (a resumed sweep) are left out, so
    a round is the same whether it runs now or is restored."""
    from trainer_core.analysis import load, lr_sweep_table, widen_lrs

    results = load(exp_dir)
    rounds = results.runs.set_index("name").get("tag_round", pd.Series(dtype=float))
    table = lr_sweep_table(results)
    wanted = widen_lrs(table[table["name"].map(rounds).fillna(0) < round_])
    return [
        trial_spec(job, plan, lr, round_)
        for plan in costliest_first(plans)
        for lr in wanted.get(plan.size, [])
    ]


def early_stopper(job: SweepJobConfig, plans: list[SizePlan]):
    """ASHA or median stopping with rungs at each size's eval steps, comparing only within a size."""
    from ray.tune.schedulers import ASHAScheduler, MedianStoppingRule

    from trainer_core.ray.early_stopping import PerSizeScheduler

    def for_size(plan: SizePlan):
        grace = rung_steps(plan, job.sweep)
        if job.sweep.early_stopping == "asha":
            return ASHAScheduler(
                time_attr="step",
                max_t=plan.steps,
                grace_period=grace,
                reduction_factor=job.sweep.reduction_factor,
            )
        return MedianStoppingRule(time_attr="step", grace_period=grace, min_samples_required=3)

    if job.sweep.early_stopping == "none":
        return None
    return PerSizeScheduler({plan.size: for_size(plan) for plan in plans})


def run_sweep(job: SweepJobConfig, sizes: list[str] | None, resume: bool) -> list[TrialsRun]:
    """Plan, check and run every size x LR trial of ``job`` (already :func:`as_sweep`), then the
    widening rounds; one TrialsRun per round that ran.

    Round k's Tune state is ``tune-widen<k>/``; a resumed sweep recomputes each round's trials
    from the results on disk, so it restores the same rounds.
    """
    from trainer_core.ray.runtime import init_ray

    plans = sweep_plans(job, sizes)
    preflight(job)
    exp_dir = Path(job.dir).resolve()
    write_experiment_record(job, plans, exp_dir)
    init_ray(job.ray.address)
    settings = TuneSettings(scheduler=early_stopper(job, plans))
    runs = [run_trials(sweep_trials(job, plans), exp_dir, settings, resume)]
    for round_ in range(1, job.sweep.widen_rounds + 1):
        specs = widening_trials(job, plans, exp_dir, round_)
        if not specs:
            break
        lrs = ", ".join(f"{s.tags['size']} {s.config.optim.lr:.3e}" for s in specs)
        print(f"widening the LR grid, round {round_}: best LR at an edge; adding {lrs}")
        settings = TuneSettings(scheduler=early_stopper(job, plans), name=f"tune-widen{round_}")
        runs.append(run_trials(specs, exp_dir, settings, resume))
    return runs
