"""Chinchilla approach 2: isoFLOP parabolas give N_opt(C); N_opt ~ C^a and D_opt ~ C^b.

At each compute budget that >= 3 sizes cover, each size's annealed loss is read off its curve
(``curves.py``), a parabola in log N is fitted through those losses, and its vertex is that
budget's compute-optimal size. Budgets whose vertex falls outside the sizes that cover them are
not used: the optimum there is an extrapolation, not a measurement. A line through
(log C, log N_opt) gives a; D_opt = C / 6 N_opt, so b = 1 - a.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd

from trainer_core.analysis.bootstrap import (
    CI_LEVEL,
    centred_on_estimate,
    parallel_map,
    percentile_interval,
)
from trainer_core.analysis.curves import budget_grid, size_curves
from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.fits import (
    ChinchillaFit,
    flagged,
    require_fit_points,
    require_positive,
)
from trainer_core.analysis.frontier import chinchilla_smoother, smoother_resamples

MIN_SIZES = 3
MIN_BUDGETS = 3


@dataclass
class IsoFLOPParabola:
    """One budget: the covering sizes' losses and loss = c2 x^2 + c1 x + c0 in x = ln N."""

    flops: float
    N: np.ndarray
    loss: np.ndarray
    coef: np.ndarray
    n_opt: float
    """The vertex; NaN when the parabola is not convex or its vertex is outside the sizes."""
    loss_opt: float

    @property
    def valid(self) -> bool:
        return math.isfinite(self.n_opt)


def isoflop_parabolas(
    points: pd.DataFrame, loss: np.ndarray | None = None
) -> list[IsoFLOPParabola]:
    """A parabola per budget covered by >= 3 sizes; ``loss`` replaces ``points.eval_loss``.
    Runs of one N (two LRs of a size, say) are one size, at their mean loss: counted apart, two
    of them made a budget of 2 sizes whose parabola nothing pins down."""
    curves = size_curves(points, loss)
    out = []
    for x in budget_grid(curves, MIN_SIZES, "isoFLOP"):
        at_n: dict[float, list[float]] = {}
        for c in curves:
            if c.covers(x):
                at_n.setdefault(c.N, []).append(c.loss(x))
        if len(at_n) < MIN_SIZES:
            continue
        n = np.array(sorted(at_n))
        values = np.array([np.mean(at_n[v]) for v in n])
        log_n = np.log(n)
        coef = np.polyfit(log_n, values, 2)
        n_opt = loss_opt = math.nan
        if coef[0] > 0:
            vertex = -coef[1] / (2 * coef[0])
            if log_n.min() <= vertex <= log_n.max():
                n_opt, loss_opt = math.exp(vertex), float(np.polyval(coef, vertex))
        out.append(IsoFLOPParabola(float(np.exp(x)), n, values, coef, n_opt, loss_opt))
    return out


def _slope(parabolas: list[IsoFLOPParabola]) -> tuple[float, float]:
    """(a, ln k) of ln N_opt = a ln C + ln k over the valid budgets (NaNs with fewer than
    MIN_BUDGETS: a bootstrap refit needs as many as the fit itself)."""
    ok = [p for p in parabolas if p.valid]
    if len(ok) < MIN_BUDGETS:
        return math.nan, math.nan
    a, log_k = np.polyfit(np.log([p.flops for p in ok]), np.log([p.n_opt for p in ok]), 1)
    return float(a), float(log_k)


def _resampled_slope(points: pd.DataFrame, log_loss: np.ndarray) -> tuple[float, float]:
    return _slope(isoflop_parabolas(points, np.exp(log_loss)))


@dataclass
class IsoFLOPFit(ShownAsText):
    """N_opt = k C^a and D_opt = C / (6 N_opt) ~ C^b from the valid isoFLOP parabolas."""

    a: float
    log_k: float
    parabolas: list[IsoFLOPParabola]
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    samples: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    n_bootstrap: int = 0
    n_sizes: int = 0
    """Sizes whose points shared a resampled offset in the bootstrap (0: no bootstrap)."""
    n_failed: int = 0
    """Resamples with fewer than MIN_BUDGETS valid budgets: no slope, so not in the intervals."""
    centred: bool = False
    """Whether the intervals are centred on this fit (approach 3's smoother implied a slope)."""

    @property
    def b(self) -> float:
        return 1.0 - self.a

    @property
    def splits_compute(self) -> bool:
        """N_opt and D_opt both grow with compute (0 < a < 1); else the line is no split of
        compute at all, and its N_opt and D_opt at a budget mean nothing."""
        return 0 < self.a < 1

    @property
    def n_budgets(self) -> int:
        return sum(p.valid for p in self.parabolas)

    def compute_optimal(self, C: float) -> tuple[float, float]:
        c = require_positive("isoFLOP.compute_optimal: C", C)
        n_opt = math.exp(self.log_k) * c**self.a
        return n_opt, c / (6 * n_opt)

    def optimal_intervals(self, C: float) -> dict[str, tuple[float, float]]:
        """Bootstrap CIs of N_opt and D_opt at C (NaNs without a bootstrap)."""
        c = require_positive("isoFLOP.optimal_intervals: C", C)
        s = self.samples
        if not s:
            return {"N": (math.nan, math.nan), "D": (math.nan, math.nan)}
        n_opt = np.exp(s["log_k"]) * c ** s["a"]
        return {"N": percentile_interval(n_opt), "D": percentile_interval(c / (6 * n_opt))}

    def resamples_used(self) -> str:
        """How many resamples the interval is of, and of how many where some gave no slope."""
        used = self.n_bootstrap - self.n_failed
        if not self.n_failed:
            return f"{used} bootstrap resamples"
        return f"{used} of {self.n_bootstrap} bootstrap resamples gave a slope"

    def describe(self, flags: bool = True) -> str:
        """a and b with their intervals; with ``flags``, the DEGENERATE and UNRESOLVED lines the
        report prints under them, from the same checks (``print(fit)`` left them out)."""
        lines = [
            f"isoFLOP (Chinchilla approach 2): N_opt ~ C^a, D_opt ~ C^b   ({self.n_budgets} of "
            f"{len(self.parabolas)} budgets with the minimum inside the sizes, "
            f"{self.resamples_used()})"
        ]
        for name, value in (("a", self.a), ("b", self.b)):
            line = f"  {name:<6}= {value:.4g}"
            lo, hi = self.ci.get(name, (math.nan, math.nan))
            if math.isfinite(lo):
                line += f"   ({100 * CI_LEVEL:.0f}% CI {lo:.4g} .. {hi:.4g})"
            lines.append(line)
        text = "\n".join(lines)
        if not flags:
            return text
        # imported here: checks.py imports this module
        from trainer_core.analysis.checks import isoflop_flags, isoflop_unresolved

        return flagged(text, isoflop_flags(self), isoflop_unresolved(self))

    def __str__(self) -> str:
        return self.describe()


def fit_isoflop(
    points: pd.DataFrame,
    n_bootstrap: int = 200,
    seed: int = 0,
    smoother: ChinchillaFit | None = None,
) -> IsoFLOPFit:
    """Approach 2 on annealed points (N, tokens, flops, eval_loss, size).

    Bootstrap: each resample redraws the points' noise around ``smoother`` (an L(N, D) fit of the
    same points, fitted here when not given) and redoes every parabola and the line; the refits
    are centred on this fit (:func:`centred_on_estimate`).
    """
    require_fit_points("fit_isoflop", points)
    parabolas = isoflop_parabolas(points)
    a, log_k = _slope(parabolas)
    valid = sum(p.valid for p in parabolas)
    if valid < MIN_BUDGETS:
        raise AnalysisError(
            f"isoFLOP: {len(parabolas)} budgets covered by {MIN_SIZES} sizes, {valid} with the "
            f"loss minimum inside the sizes' range; need {MIN_BUDGETS} (add sizes around the "
            "optimum or train the smaller ones longer)"
        )
    fit = IsoFLOPFit(a, log_k, parabolas)
    smoother = smoother or (chinchilla_smoother(points) if n_bootstrap > 0 else None)
    if n_bootstrap > 0 and smoother is not None:
        resamples = smoother_resamples(points, smoother, n_bootstrap, seed)
        slopes = np.array(parallel_map(partial(_resampled_slope, points), resamples))
        at_smoother = np.array(
            _resampled_slope(points, np.log(smoother.predict_frame(points))), dtype=float
        )
        slopes = centred_on_estimate(slopes, np.array([a, log_k]), at_smoother)
        fit.centred = bool(np.all(np.isfinite(at_smoother)))
        fit.samples = {"a": slopes[:, 0], "b": 1 - slopes[:, 0], "log_k": slopes[:, 1]}
        fit.ci = {name: percentile_interval(fit.samples[name]) for name in ("a", "b")}
        fit.n_bootstrap = n_bootstrap
        fit.n_failed = int(np.sum(~np.isfinite(slopes[:, 0])))
        fit.n_sizes = points["size"].nunique()
    return fit
