"""Hyperparameter sweep planning (no Ray): which peak LRs and global batches each size tries, at
which token horizons, and each trial's run config.

Each size's LRs are log-spaced multiples of the ladder formula's LR (or log-uniform random draws);
its batches are multiples of the batch the ladder plans for it, each re-planned so the mesh and
micro-batch hold it. Runs are short by default (a fraction of the ladder's duration, the schedule
compressed with it) and evaluate at ASHA's rungs, so early stopping compares eval losses.

Horizons: a WSD-S run's decays each end in a finished-schedule (annealed) loss, so one trial
gives a point at every horizon its decays end at (see :func:`horizon_route`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

from trainer_core.config.sections import TrainConfig, require
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.plan import SizePlan, plan_ladder

L = TypeVar("L", bound=LadderConfig)
Route = Literal["decays", "runs"]


@dataclass
class SweepConfig:
    """The LR (and batch) sweep: which LRs and batches each size tries, for how long, and how
    early stopping prunes them."""

    search: Literal["grid", "random"] = "grid"
    """How each size's LRs are picked: "grid" tries every one of ``factors``, "random" draws
    ``num_samples``."""
    factors: list[float] = field(default_factory=lambda: [2.0**k for k in range(-3, 4)])
    """Grid: multiples of the ladder's formula LR."""
    num_samples: int = 8
    """Random: LRs per size, log-uniform in [min(factors), max(factors)] x formula LR."""
    batch_factors: list[float] = field(default_factory=lambda: [1.0])
    """Multiples of each size's planned global batch, each rounded to a batch the size's mesh
    holds in whole micro-batches per data-parallel rank; every LR runs at every batch."""
    duration_multiple: float = 0.25
    """Chinchilla multiple c of each sweep run, at most the ladder's own c (full_length: the ladder's)."""
    horizons: list[float] = field(default_factory=list)
    """Chinchilla multiples of the token horizons to sweep (powers of two, each capped at the
    ladder's own c); empty: ``duration_multiple`` alone (a WSD-S run still gives a point at each
    of the ladder's decays)."""
    horizon_trials: Literal["auto", "decays", "runs"] = "auto"
    """How trials cover the horizons: "decays" (one WSD-S run to the longest, a decay ending at
    each), "runs" (one run per horizon), "auto" (decays when the ladder's schedule is WSD-S)."""
    full_length: bool = False
    """Train each trial for the ladder's own duration (not duration_multiple or horizons)."""
    early_stopping: Literal["asha", "median", "none"] = "asha"
    """Stop trials that lose to others of their size and run length: "asha" (successive halving
    at the rungs), "median" (worse than the others' median at equal tokens), "none" (never)."""
    grace_fraction: float = 0.25
    """ASHA's first rung, as a fraction of the run's tokens; also the sweep runs' eval interval
    (in place of ``run.trainer.eval_interval``), so every rung sees an eval loss. On a WSD-S run
    whose decays end at 1/4 and 1/2 (and reduction_factor 2), the rungs fall on decay ends and
    compare annealed losses."""
    reduction_factor: int = 2
    """ASHA: each rung is this many times further than the one before and keeps 1 in this many
    trials."""
    widen_rounds: int = 2
    """Rounds of extra trials while a best trial is at the edge of its grid: an LR a grid step
    beyond (at the best batch), or a batch a grid step beyond (at the best LR); 0: never widen."""
    dir: str = ""
    """Where the sweep writes; empty: beside the ladder's dir, ``<dir>-lr-sweep``, so one config
    serves the sweep and then the ladder (feed it back with ``lr.from_sweep``, ``batch.from_sweep``)."""

    def __post_init__(self) -> None:
        for name in ("factors", "batch_factors"):
            values = getattr(self, name)
            require(bool(values) and min(values) > 0, name, values, "must be positive")
        require(
            self.duration_multiple > 0 and math.log2(self.duration_multiple).is_integer(),
            "duration_multiple",
            self.duration_multiple,
            "must be a power of two (a Chinchilla multiple, e.g. 0.25)",
        )
        require(
            all(h > 0 and math.log2(h).is_integer() for h in self.horizons),
            "horizons",
            self.horizons,
            "must be powers of two (Chinchilla multiples, e.g. [0.25, 0.5, 1])",
        )
        require(
            not (self.full_length and self.horizons),
            "horizons",
            self.horizons,
            "full_length runs the ladder's own durations: leave horizons empty",
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
class SweepRun:
    """One size at one global batch and run length: the plan its LR trials share."""

    plan: SizePlan
    ladder: LadderConfig = field(repr=False)
    """The ladder it was planned from (the sweep's duration): re-plans it at another batch."""

    @property
    def group(self) -> str:
        """Early stopping's comparison group: one size and run length. Batches share it: ASHA
        compares them at equal tokens, which is the comparison B* is about (the best batch for a
        horizon D), and a group per batch could never stop a bad batch."""
        return f"{self.plan.size}@{self.plan.chinchilla_multiple:g}x"

    @property
    def total_flops(self) -> float:
        return self.plan.total_flops

    @property
    def trial_stem(self) -> str:
        """Its trials' names but the LR: ``<size>-c<multiple>-b<batch>-lr``."""
        p = self.plan
        return f"{p.size}-c{p.chinchilla_multiple:g}-b{p.batch_tokens}-lr"


def horizon_route(ladder: LadderConfig, sweep: SweepConfig) -> Route:
    """Trials cover the horizons with WSD-S decays unless set otherwise or the schedule is cosine.

    Decays by default under WSD-S: one trial's decays give annealed points at every horizon, so
    the horizons cost the longest run alone, not their sum (1.75x less for 1/4, 1/2, 1), and
    they are the points the ladder's own WSD-S runs are fitted on. Their cost: every horizon
    shares the longest run's warmup and stable phase. A cosine run anneals only at its end, so
    it needs a run per horizon.
    """
    if sweep.horizon_trials != "auto":
        return sweep.horizon_trials
    return "decays" if ladder.duration.schedule == "wsds" else "runs"


def sweep_horizons(ladder: LadderConfig, sweep: SweepConfig) -> list[float]:
    """The Chinchilla multiples swept, ascending, each at most the ladder's own."""
    cap = ladder.duration.chinchilla_multiple
    return sorted({min(h, cap) for h in sweep.horizons or [sweep.duration_multiple]})


def sweep_durations(ladder: L, sweep: SweepConfig) -> list[L]:
    """The ladder at each run length the sweep's trials take: the ladder itself with
    ``full_length``; one WSD-S ladder to the longest horizon with a decay ending at each (route
    "decays"; one horizon keeps the ladder's schedule and decay points); else one ladder per
    horizon."""
    if sweep.full_length:
        return [ladder]
    horizons = sweep_horizons(ladder, sweep)
    if horizon_route(ladder, sweep) == "runs":
        return [_with_duration(ladder, c) for c in horizons]
    longest = horizons[-1]
    points = [h / longest for h in horizons] if len(horizons) > 1 else None
    return [_with_duration(ladder, longest, points)]


def _with_duration(ladder: L, multiple: float, decay_points: list[float] | None = None) -> L:
    duration = replace(ladder.duration, chinchilla_multiple=multiple, multiple_by_size={})
    if decay_points is not None:
        duration = replace(duration, schedule="wsds", decay_points=decay_points)
    return replace(ladder, duration=duration)


def at_batch(ladder: L, size: str, batch_tokens: float) -> SweepRun:
    """``size`` of ``ladder`` planned for a target global batch: the plan rounds it to whole
    micro-batches per data-parallel rank, and the steps, warmup, decays and checkpoints follow."""
    batch = replace(ladder.batch, coef=float(batch_tokens), exponent=0.0)
    target = replace(ladder, batch=batch)
    return SweepRun(plan_ladder(target, [size])[0], target)


def plan_sweep(ladder: L, sweep: SweepConfig, sizes: list[str] | None = None) -> list[SweepRun]:
    """Every (size, run length, batch) the sweep trains; batch factors that round to the same
    batch give one run."""
    runs = []
    for timed in sweep_durations(ladder, sweep):
        for base in plan_ladder(timed, sizes):
            batches: dict[int, SweepRun] = {}
            for factor in sorted(sweep.batch_factors, key=lambda f: abs(math.log(f))):
                run = (
                    SweepRun(base, timed)
                    if factor == 1
                    else at_batch(timed, base.size, factor * base.batch_tokens)
                )
                batches.setdefault(run.plan.batch_tokens, run)
            runs.extend(batches.values())
    return runs


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


def trial_config(plan: SizePlan, sweep: SweepConfig, lr: float) -> TrainConfig:
    """The size's planned run at peak LR ``lr``, evaluating at every rung."""
    cfg = plan.config
    return replace(
        cfg,
        optim=replace(cfg.optim, lr=lr),
        trainer=replace(cfg.trainer, eval_interval=rung_steps(plan, sweep)),
    )
