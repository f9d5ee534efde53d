"""Learning-rate sweeps on Ray Tune: the size x LR trials that ``trainer_core.ladder.sweep`` plans, run
on the ladder's trial machinery with early stopping.

ASHA (or median stopping) on eval loss at the eval steps frees the resources of clearly worse LRs.
A size whose best LR is at the edge of its grid gets more rounds of trials beyond that edge
(``sweep.widen_rounds``), each a Tune experiment of its own beside the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from trainer_core.io import storage
from trainer_core.io.storage import Location
from trainer_core.ladder.plan import SizePlan, named_run, plan_ladder
from trainer_core.ladder.record import preflight, write_experiment_record
from trainer_core.ladder.sweep import (
    SweepConfig,
    rung_steps,
    sweep_durations,
    sweep_lrs,
    trial_config,
)
from trainer_core.ray.ladder_run import LadderJobConfig, on_ray
from trainer_core.ray.tune_run import (
    TrialSpec,
    TrialsRun,
    TuneSettings,
    costliest_first,
    fmt_lr,
    run_trials,
)


@dataclass
class SweepJobConfig(LadderJobConfig):
    sweep: SweepConfig = field(default_factory=SweepConfig)


def as_sweep(job: SweepJobConfig) -> SweepJobConfig:
    """The job with the sweep's own dir and name: the ladder's dir holds the ladder's runs."""
    return replace(job, dir=job.sweep.dir or f"{job.dir}-lr-sweep", name=f"{job.name}-lr-sweep")


def sweep_plans(job: SweepJobConfig, sizes: list[str] | None) -> list[SizePlan]:
    return plan_ladder(sweep_durations(job, job.sweep), sizes)


def trial_spec(job: SweepJobConfig, plan: SizePlan, lr: float, round_: int = 0) -> TrialSpec:
    """One size x LR trial; ``round_`` > 0: a trial added by widening the grid."""
    name = f"{plan.size}-lr{fmt_lr(lr)}"
    tags = {"sweep": job.name, "size": plan.size, "lr_factor": lr / plan.lr, "round": round_}
    cfg = named_run(trial_config(plan, job.sweep, lr), job, name)
    return TrialSpec(name=name, config=on_ray(cfg, plan, job), tags=tags)


def sweep_trials(job: SweepJobConfig, plans: list[SizePlan]) -> list[TrialSpec]:
    """Every size x LR trial: sizes costliest first, each size's LRs centre out."""
    return [
        trial_spec(job, plan, lr)
        for plan in costliest_first(plans)
        for lr in sweep_lrs(plan, job.sweep, job.run.trainer.seed)
    ]


def widening_trials(
    job: SweepJobConfig, plans: list[SizePlan], exp_dir: Location, round_: int
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
    exp_dir = storage.normalize(job.dir, absolute=True)
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
