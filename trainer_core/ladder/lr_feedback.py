"""Feeding sweeps back into a ladder: ``lr: {from_sweep: <dir>}`` and ``batch: {from_sweep: <dir>}``.

Each size's peak LR is the fitted LR*(N, D) = c N^a D^b at the size's own horizon, and its
target batch the fitted B*(D) (or B*(N, D)), both with the law's 95% bootstrap interval
(:mod:`trainer_core.analysis.hparam_laws`). A sweep with one horizon per size cannot tell D's
effect from N's: the LR then comes from LR*(N) as fitted per size (:func:`fit_sweep_lr`), not
moved with the horizon, and the plan says so.

Which horizon sets the LR: the run's final D (steps x batch). A WSD-S run decays at several
points but has one peak LR; the final decay is the horizon the run is named and budgeted for,
the one the size's longest (most compute) point sits at, and what "train N on D tokens" means.
The dry run also prints what the earliest decay's horizon would want, so the price of one LR for
every decay is in view. The batch is fitted at the configured horizon (20 N c tokens), since
the final D depends on the batch; the two differ by less than one batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer_core.config.loader import ConfigError
from trainer_core.io import storage
from trainer_core.io.run_dir import EXPERIMENT, RUNS, run_json_path
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.formulas import BATCH_SWEEP_LAWS

if TYPE_CHECKING:
    import pandas as pd

    from trainer_core.analysis import HparamLawFit, LRPowerLawFit
    from trainer_core.analysis.hparam_table import SweepCells

LR_KEY = "lr.from_sweep"
BATCH_KEY = "batch.from_sweep"
ONE_HORIZON = "one horizon per size: not moved with D"
"""How the plan (and the sweep's report) names LR*(N), the law of a one-horizon sweep."""


@dataclass(frozen=True)
class SweepChoice:
    """A hyperparameter a sweep's law set for one size: its value at (N, D), the law's 95%
    interval there (NaN where the law has none) and which law it was."""

    value: float
    low: float
    high: float
    D: float
    """The horizon, in tokens, the law was read at."""
    law: str
    sweep_dir: str
    extrapolated: tuple[str, ...] = ()
    """Which of N and D lie outside the swept cells."""
    d_exponent: float = 0.0
    """The law's exponent of D (0 without a D term): what another horizon would want."""

    def at(self, D: float) -> float:
        """The law's value at another horizon of the same size."""
        return self.value * (D / self.D) ** self.d_exponent

    def covers(self, x: float) -> bool:
        return self.low <= x <= self.high

    def as_record(self) -> dict[str, object]:
        """The choice as plan.json keeps it."""
        return {
            "dir": self.sweep_dir,
            "law": self.law,
            "value": self.value,
            "interval_95": [self.low, self.high] if math.isfinite(self.low) else None,
            "horizon_tokens": round(self.D),
            "extrapolated": list(self.extrapolated),
        }

    def interval(self, fmt: str) -> str:
        if not math.isfinite(self.low):
            return "no interval"
        return f"95% {self.low:{fmt}}..{self.high:{fmt}}"


@dataclass
class SweepRules:
    """The laws a ladder plans from: LR*(N, D) (or LR*(N) from a one-horizon sweep) and B*;
    None where the formula rules."""

    lr_law: HparamLawFit | None = None
    lr_of_n: LRPowerLawFit | None = None
    lr_dir: str = ""
    batch_law: HparamLawFit | None = None
    batch_dir: str = ""

    def lr(self, N: float, D: float) -> SweepChoice | None:
        if self.lr_law is not None:
            return _choice(self.lr_law, N, D, self.lr_dir)
        if self.lr_of_n is None:
            return None
        fit = self.lr_of_n
        law = f"{fit} ({ONE_HORIZON})"
        outside = ("N",) if fit.outside(N) else ()
        return SweepChoice(fit.predict(N), *fit.interval(N), D, law, self.lr_dir, outside)

    def batch(self, N: float, D: float) -> SweepChoice | None:
        law = self.batch_law
        return None if law is None else _choice(law, N, D, self.batch_dir)


def _choice(law: HparamLawFit, N: float, D: float, sweep_dir: str) -> SweepChoice:
    value, low, high = law.predict(N, D)
    b = law.exponents.get("D", 0.0)
    name = f"{law.formula} ({law.conditional})" if law.conditional else law.formula
    return SweepChoice(value, low, high, D, name, sweep_dir, law.outside(N, D), b)


def sweep_rules(ladder: LadderConfig) -> SweepRules | None:
    """The laws of ``lr.from_sweep`` and ``batch.from_sweep`` (None when neither is set), or a
    one-line ConfigError naming the key and the fix."""
    lr_dir, batch_dir = ladder.lr.from_sweep, ladder.batch.from_sweep
    if not (lr_dir or batch_dir):
        return None
    loaded: dict[str, SweepCells] = {}
    rules = SweepRules(lr_dir=lr_dir, batch_dir=batch_dir)
    if lr_dir:
        rules.lr_law, rules.lr_of_n = lr_laws(_load(LR_KEY, lr_dir, loaded), lr_dir)
    if batch_dir:
        terms = BATCH_SWEEP_LAWS[ladder.batch.sweep_law]
        rules.batch_law = batch_law(_load(BATCH_KEY, batch_dir, loaded), batch_dir, terms)
    return rules


def _load(key: str, sweep_dir: str, loaded: dict) -> SweepCells:
    """The sweep at ``sweep_dir``, read once when both keys name it."""
    from trainer_core.analysis import AnalysisError, load
    from trainer_core.analysis.hparam_table import SweepCells

    if sweep_dir not in loaded:
        _refuse_run_dir(key, sweep_dir)
        try:
            loaded[sweep_dir] = SweepCells(load(sweep_dir))
        except AnalysisError as e:
            what = "an LR fit" if key == LR_KEY else "a batch fit"
            raise ConfigError(
                f"{key}: {sweep_dir!r} can't give {what}: {e}; point {key} at a sweep's dir"
            ) from None
    return loaded[sweep_dir]


def _refuse_run_dir(key: str, sweep_dir: str) -> None:
    """One run's dir (a sweep trial's, ``<sweep>/runs/<name>``) holds no sweep: say so, naming
    the sweep's experiment dir where the layout shows it."""
    where = storage.as_location(sweep_dir)
    if not storage.is_file(run_json_path(where)):
        return
    runs = storage.parent(where)
    exp = storage.parent(runs)
    if storage.name(runs) == RUNS and storage.is_file(storage.join(exp, EXPERIMENT)):
        fix = f"pass its sweep's experiment dir, {str(exp)!r}"
    else:
        fix = f"pass the sweep's experiment dir (the one holding {EXPERIMENT} and {RUNS}/)"
    raise ConfigError(f"{key}: {sweep_dir!r} is one run's dir, not a sweep's: {fix}")


def horizons_swept(table: pd.DataFrame) -> int:
    """The most horizons D any one size has annealed points at (a sweep table, ``hparam_table``):
    what the sweep tried, bracketed or not."""
    return int(table.groupby("N")["D"].nunique().max()) if len(table) else 0


def lr_laws(sweep: SweepCells, sweep_dir: str) -> tuple[HparamLawFit | None, LRPowerLawFit | None]:
    """The LR law ``lr.from_sweep`` plans with, shared with the sweep's report and the analysis's
    target table so all show one law: (LR*(N, D), None) where some size was swept at two
    horizons, else (None, LR*(N)).

    Decided by the horizons swept, not those whose cells bracket their optimum: a sweep of
    several horizons whose grids miss the optima is refused (widen them), never read as one
    horizon per size and planned with LR*(N)."""
    from trainer_core.analysis import AnalysisError, fit_sweep_lr, horizons_per_size

    swept = horizons_swept(sweep.table)
    if swept < 2:
        try:
            return None, fit_sweep_lr(sweep.results)
        except AnalysisError as e:
            raise ConfigError(f"{LR_KEY}: {sweep_dir!r} can't give an LR fit: {e}") from None
    cells = sweep.cells("lr")
    if horizons_per_size(cells) < 2:
        raise ConfigError(
            f"{LR_KEY}: {sweep_dir!r} sweeps {swept} horizons of a size, but no size has a "
            f"bracketed LR optimum at two of them, so LR*(N, D) has no D to fit: "
            f"{_widen(LR_KEY)}, or remove {LR_KEY}"
        )
    return _fit(LR_KEY, sweep_dir, cells, ("N", "D")), None


def batch_law(sweep: SweepCells, sweep_dir: str, terms: tuple[str, ...]) -> HparamLawFit:
    """The B* law ``batch.from_sweep`` plans with (``terms``: ``batch.sweep_law``'s factors),
    shared like :func:`lr_laws`."""
    cells = sweep.cells("batch")
    if not cells:
        raise ConfigError(
            f"{BATCH_KEY}: {sweep_dir!r} tries one batch per (N, D) cell, so it has no B* to "
            f"fit: sweep batch sizes too, or remove {BATCH_KEY}"
        )
    return _fit(BATCH_KEY, sweep_dir, cells, terms)


def _widen(key: str) -> str:
    """The fix for cells whose grid misses their optimum."""
    grid = "sweep.factors" if key == LR_KEY else "sweep.batch_factors"
    return f"widen the grid ({grid}) or raise sweep.widen_rounds"


def _fit(key: str, sweep_dir: str, cells: list, terms: tuple[str, ...]) -> HparamLawFit:
    """The law of ``terms`` through ``cells``, refused when too few cells bracket their optimum
    (two to spare beyond the law's parameters, so its scatter is measured) or a term stays open."""
    from trainer_core.analysis import AnalysisError, fit_hparam_law

    name = f"{'LR*' if key == LR_KEY else 'B*'}({', '.join(terms)})"
    bracketed = sum(not c.at_edge for c in cells)
    need = len(terms) + 3
    if bracketed < need:
        fix = _widen(key) if len(cells) >= need else "add sizes or horizons to the sweep"
        raise ConfigError(
            f"{key}: {sweep_dir!r} has {bracketed} of {len(cells)} (N, D) cells with a "
            f"bracketed optimum; {name} needs at least {need}: {fix}, or remove {key}"
        )
    try:
        law = fit_hparam_law(cells, terms)
    except AnalysisError as e:
        raise ConfigError(f"{key}: {sweep_dir!r} can't give {name}: {e}") from None
    if law.notes:
        fix = "sweep horizons or sizes further apart or more trials per cell"
        if key == BATCH_KEY and "N" in terms and law.notes[0].startswith("a "):
            fix = "B* shows no dependence on N here: set batch.sweep_law: D"
        raise ConfigError(
            f"{key}: {name} from {sweep_dir!r} is unresolved ({law.notes[0]}): {fix}, "
            f"or remove {key}"
        )
    return law
