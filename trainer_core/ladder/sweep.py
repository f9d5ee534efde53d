"""Learning-rate sweep planning (no Ray): which LRs each size tries, for how long, and each
trial's run config.

Each size's LRs are log-spaced multiples of the ladder formula's LR (or log-uniform random draws);
runs are short by default (a fraction of the ladder's duration, the schedule compressed with it),
and evaluate at ASHA's rungs so early stopping compares eval losses.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

from trainer_core.config.sections import TrainConfig, require
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.plan import SizePlan

L = TypeVar("L", bound=LadderConfig)


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


def sweep_durations(ladder: L, sweep: SweepConfig) -> L:
    """The ladder with the sweep's duration: ``duration_multiple`` (at most the ladder's own) for
    every size, unless ``full_length``."""
    if sweep.full_length:
        return ladder
    multiple = min(sweep.duration_multiple, ladder.duration.chinchilla_multiple)
    duration = replace(ladder.duration, chinchilla_multiple=multiple, multiple_by_size={})
    return replace(ladder, duration=duration)


def trial_config(plan: SizePlan, sweep: SweepConfig, lr: float) -> TrainConfig:
    """The size's planned run at peak LR ``lr``, evaluating at every rung."""
    cfg = plan.config
    return replace(
        cfg,
        optim=replace(cfg.optim, lr=lr),
        trainer=replace(cfg.trainer, eval_interval=rung_steps(plan, sweep)),
    )
