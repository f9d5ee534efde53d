"""Scaling-law fits: loss vs compute L(C) and the Chinchilla form L(N, D), with bootstrap CIs.

``solver.py`` fits both (how, and how it refits the resamples); here is what each law adds: its
grid of initial values, its checks on the points, and its predictions and their intervals.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pandas as pd

from trainer_core.analysis.bootstrap import (
    CI_LEVEL,
    centred_on_estimate,
    fits_every_point,
    no_noise_to_redraw,
    percentile_interval,
    prediction_interval,
    scaled_onto_estimate,
)
from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.solver import (
    LOCAL_STARTS,
    Problem,
    best_grid_points,
    fit_problem,
    solve,
    uncertainty,
)

CHINCHILLA_SIZE_PARAMS = 3
"""Parameters of L(N, D) that differ between sizes (E, A, alpha): they absorb per-size offsets."""

ArrayLike = Sequence[float] | np.ndarray | pd.Series


def _format(title: str, values: dict[str, float], fit: PowerLawFit | ChinchillaFit) -> str:
    std, ci = fit.std, fit.ci
    lines = [f"{title}   ({fit.n_points} points, {fit.n_bootstrap} bootstrap resamples)"]
    for name, value in values.items():
        line = f"  {name:<6}= {value:.4g}"
        if math.isfinite(std.get(name, math.nan)):
            lo, hi = ci[name]
            # A std beyond the value itself is a heavy tail's (A trading off with alpha): the
            # percentile interval says it, the std would only mislead.
            spread = f" ± {std[name]:.2g}" if std[name] < abs(value) else ""
            line += f"{spread}   ({100 * CI_LEVEL:.0f}% CI {lo:.4g} .. {hi:.4g})"
        lines.append(line)
    return "\n".join(lines)


def require_positive(what: str, value: ArrayLike | float) -> np.ndarray | float:
    """``value`` as a float (an array of floats for an array), every one a positive finite
    number: a law's powers of anything else are complex, zero or infinite, and fail far from the
    value that caused them (an isoFLOP N_opt at C = 0 divided by zero). A string is refused, not
    parsed: it passed this check as its number and then failed a format code downstream."""
    if isinstance(value, str | bytes):
        raise AnalysisError(f"{what} = {value!r}: must be a positive finite number, not a string")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        arr = np.array(math.nan)
    bad = int(np.count_nonzero(~(np.isfinite(arr) & (arr > 0))))
    if arr.ndim == 0:
        if bad:
            raise AnalysisError(f"{what} = {value!r}: must be a positive finite number")
        return float(arr)
    if bad:
        raise AnalysisError(
            f"{what}: every value must be a positive finite number ({bad} of {arr.size} are not)"
        )
    return arr


POINT_COLUMNS = ("size", "N", "tokens", "flops", "eval_loss")
"""The columns of ``ExperimentResults.fit_points()`` the fits of a points table read."""


def require_fit_points(
    what: str, points: pd.DataFrame, columns: Sequence[str] = POINT_COLUMNS
) -> None:
    """Refuse a points table a fit would misread: not a frame, lacking ``columns``, or holding
    evals from before a decay ended. ``ExperimentResults.points`` has those too (``annealed``
    False, at peak LR, far above the curve), and the fits took them in silently: a ladder's
    L(N, D) came out E 0.19, alpha 0.27 on every eval against E 0.57, alpha 1.23 on the
    annealed ones."""
    if not isinstance(points, pd.DataFrame):
        raise AnalysisError(
            f"{what}: points must be a DataFrame (results.fit_points()), not "
            f"{type(points).__name__}"
        )
    missing = [c for c in columns if c not in points.columns]
    if missing:
        raise AnalysisError(
            f"{what}: the points lack column(s) {', '.join(missing)} (it reads "
            f"{', '.join(columns)}); pass results.fit_points()"
        )
    if "annealed" in points.columns and not points["annealed"].astype(bool).all():
        early = int((~points["annealed"].astype(bool)).sum())
        raise AnalysisError(
            f"{what}: {early} of the {len(points)} points are evals before a decay ended "
            "(annealed False), above the curve a fit is of; pass results.fit_points(): the "
            "annealed evals; .points holds every eval"
        )


def _groups(groups: ArrayLike | None, n: int, what: str) -> np.ndarray | None:
    """Size labels that tie points into one run (resampled as a unit), or None."""
    if groups is None:
        return None
    arr = np.asarray(groups).ravel()
    if arr.size != n:
        raise AnalysisError(f"{what}: groups has {arr.size} labels for {n} points")
    return arr


def _as_arrays(what: str, min_points: int, **columns: ArrayLike) -> list[np.ndarray]:
    """Validated float arrays: positive, finite, equal length, at least ``min_points``."""
    arrays = []
    for name, values in columns.items():
        arr = np.asarray(values, dtype=float).ravel()
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise AnalysisError(f"{what}: every value of {name} must be a positive finite number")
        arrays.append(arr)
    sizes = {name: arr.size for name, arr in zip(columns, arrays, strict=True)}
    if len(set(sizes.values())) > 1:
        raise AnalysisError(f"{what}: inputs differ in length ({sizes})")
    if arrays[0].size < min_points:
        raise AnalysisError(f"{what} needs >= {min_points} points, got {arrays[0].size}")
    return arrays


# -- L(C) ----------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class FitStats(ShownAsText):
    """What every fit carries besides its parameters: its size, objective and bootstrap."""

    n_points: int
    objective: float
    std: dict[str, float] = field(default_factory=dict)
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    n_bootstrap: int = 0
    samples: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    n_sizes: int = 0
    """Sizes whose points shared a resampled offset in the bootstrap (0: none grouped)."""
    no_intervals: str = ""
    """Why there are no bootstrap intervals, one line for the report ("" when there are, or when
    none were asked for and nothing else stood in the way)."""
    min_loss: float = math.nan
    """The smallest loss of the points fitted, which E is judged against
    (:func:`~trainer_core.analysis.checks.fit_flags`); NaN where not known (a fit built by hand)."""
    centre: dict[str, float] = field(default_factory=dict)
    """The points' geometric mean of each variable (N and D; C for L(C)): where a coefficient's
    term is read free of its trade-off with its exponent (:meth:`term_at_centre`); empty where
    not known (a fit built by hand)."""

    TERMS: ClassVar[dict[str, tuple[str, str]]] = {}
    """Each coefficient's variable and exponent: its term is ``coef * variable^-exponent``."""

    def term_at_centre(self, coef: str) -> tuple[str, float, float, tuple[float, float]] | None:
        """``coef``'s term at the points' centre: (variable, centre, value, CI_LEVEL interval of
        the refits'). Over a ladder's few sizes A and alpha trade off (A's interval can span
        orders of magnitude); the loss their term adds where the points are is free of that
        trade-off, though not of E's. None without a centre."""
        var, exponent = self.TERMS[coef]
        at = self.centre.get(var, math.nan)
        if not math.isfinite(at):
            return None
        value = getattr(self, coef) * at ** -getattr(self, exponent)
        s = self.samples
        refits = s[coef] * at ** -s[exponent] if s else np.empty(0)
        return var, at, value, percentile_interval(self._onto_this_fit(refits, at))

    def _onto_this_fit(self, refits: np.ndarray, at: float) -> np.ndarray:
        """Refits' terms as this fit's spread (they spread around this fit unless overridden)."""
        return refits

    def describe(self, flags: bool = True) -> str:
        """The parameters and their intervals; with ``flags``, under them the DEGENERATE and
        UNRESOLVED lines the report prints, from the same checks: ``print(fit)`` showed
        E = 1.4e-10 with its interval and no word that it is zero in effect."""
        text = _format(self.title, self.params(), self)
        if not flags:
            return text
        # imported here: checks.py imports this module
        from trainer_core.analysis.checks import fit_flags, unresolved

        return flagged(text, fit_flags(self, self.min_loss), unresolved(self, self.min_loss))

    def __str__(self) -> str:
        return self.describe()


def flagged(text: str, degenerate: list[str], open_params: list[str]) -> str:
    """``text`` with a fit's flag lines under it, as the report prints them."""
    from trainer_core.analysis.checks import format_flags  # checks.py imports this module

    lines = [text]
    if degenerate:
        lines.append(format_flags(degenerate))
    if open_params:
        lines.append(format_flags(open_params, "UNRESOLVED"))
    return "\n".join(lines)


def _fit_stats(
    named: dict[str, np.ndarray],
    n_points: int,
    objective: float,
    n_params: int,
    spread: dict[str, np.ndarray] | None = None,
    min_loss: float = math.nan,
) -> dict:
    """FitStats fields from the bootstrap refits' named parameters; ``spread``: the copy of them
    that ``std`` and ``ci`` describe, when not ``named`` (refits moved onto the estimate)."""
    std, ci = uncertainty(named if spread is None else spread)
    n_bootstrap = len(next(iter(named.values()))) if named else 0
    why = no_noise_to_redraw(n_points, n_params) if fits_every_point(n_points, n_params) else ""
    return {
        "n_points": n_points,
        "objective": objective,
        "std": std,
        "ci": ci,
        "n_bootstrap": n_bootstrap,
        "samples": named,
        "no_intervals": why,
        "min_loss": min_loss,
    }


def _moved(samples: np.ndarray, theta: np.ndarray, around: np.ndarray) -> np.ndarray:
    """(n, 3) raw refits drawn around ``around``, moved onto ``theta``: log E and log A shifted,
    alpha scaled, so that no moved exponent goes below the zero the fitter bounds it at."""
    moved = samples.astype(float, copy=True)
    moved[:, :2] = centred_on_estimate(samples[:, :2], theta[:2], around[:2])
    moved[:, 2] = scaled_onto_estimate(samples[:, 2], float(theta[2]), float(around[2]))
    return moved


def _power_law_named(raw: np.ndarray) -> dict[str, np.ndarray]:
    """E, A, alpha of (n, 3) raw parameters (log E, log A, alpha)."""
    return {"E": np.exp(raw[:, 0]), "A": np.exp(raw[:, 1]), "alpha": raw[:, 2]}


@dataclass
class PowerLawFit(FitStats):
    """L(C) = E + A * C^(-alpha), C in FLOPs; ``samples``: the bootstrap refits' parameters as
    refitted, ``std`` and ``ci``: their spread moved onto this fit (:meth:`from_samples`)."""

    E: float
    A: float
    alpha: float
    title: str = "L(C) = E + A * C^-alpha"
    reference: tuple[float, float, float] | None = None
    """(E, A, alpha) of the law the refits spread around when it is not this one; None when
    they spread around this fit."""

    EXPONENTS = ("alpha",)
    TERMS: ClassVar[dict[str, tuple[str, str]]] = {"A": ("C", "alpha")}

    @classmethod
    def from_samples(
        cls,
        theta: np.ndarray,
        samples: np.ndarray,
        n_points: int,
        objective: float,
        title: str,
        reference: np.ndarray | None = None,
        min_loss: float = math.nan,
        centre: float = math.nan,
    ) -> PowerLawFit:
        """From raw parameters (log E, log A, alpha) and an (n_bootstrap, 3) array of refits.

        ``reference``: the raw parameters the refits spread around when that is not ``theta``
        (the frontier's resamples are drawn around L(N, D), whose frontier the envelope need not
        follow). Each parameter's refits are then moved onto ``theta`` (:func:`_moved`), so its
        interval is this estimate's spread, and :meth:`predict_interval` moves predictions, not
        parameters, by the two laws' ratio: moved parameters would break the trade-off of E, A
        and alpha (on the demo, prediction intervals of 0.5 .. 7.3). The refits are kept as
        they are, so that moving predictions needs no moving back. ``min_loss``: the smallest
        loss of the points fitted (:attr:`FitStats.min_loss`); ``centre``: their compute's
        geometric mean (:attr:`FitStats.centre`).
        """
        around = np.asarray(theta if reference is None else reference, dtype=float)
        named, spread = _power_law_named(samples), _power_law_named(_moved(samples, theta, around))
        stats = _fit_stats(named, n_points, objective, len(theta), spread, min_loss)
        law = None
        if reference is not None and np.all(np.isfinite(around)):
            law = (math.exp(around[0]), math.exp(around[1]), float(around[2]))
        e, a, alpha = theta
        stats["centre"] = {"C": centre} if math.isfinite(centre) else {}
        return cls(math.exp(e), math.exp(a), float(alpha), title=title, reference=law, **stats)

    def params(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "alpha": self.alpha}

    def predict(self, C: ArrayLike | float) -> np.ndarray | float:
        c = np.asarray(require_positive("L(C).predict: C", C))
        out = self.E + self.A * c ** (-self.alpha)
        return float(out) if out.ndim == 0 else out

    def predict_frame(self, df: pd.DataFrame) -> np.ndarray:
        return np.asarray(self.predict(df["flops"].to_numpy(float)))

    def predict_samples(self, C: ArrayLike | float) -> np.ndarray:
        """The bootstrap refits' L(C) (empty without a bootstrap): each refit's own prediction,
        times this fit's over the ``reference`` law's when they spread around that. One row
        per refit, of ``C``'s shape."""
        s = self.samples
        if not s:
            return np.empty(0)
        c = np.asarray(require_positive("L(C).predict_samples: C", C))
        e, a, alpha = (_per_refit(s[k], c) for k in ("E", "A", "alpha"))
        refits = e + a * c**-alpha
        if self.reference is None:
            return refits
        e, a, alpha = self.reference
        return refits * self.predict(c) / (e + a * c**-alpha)

    def predict_interval(
        self, C: ArrayLike | float
    ) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
        """The CI_LEVEL interval of :meth:`predict_samples` at each ``C`` (a band: arrays of
        ``C``'s shape, for an array); NaNs without a bootstrap."""
        return prediction_interval(self.predict_samples(C), np.shape(C))

    def _onto_this_fit(self, refits: np.ndarray, at: float) -> np.ndarray:
        """Times this fit's term over the ``reference`` law's, as :meth:`predict_samples` does
        (L(C) has one term, A's)."""
        if self.reference is None:
            return refits
        _, a, alpha = self.reference
        return refits * self.A * at**-self.alpha / (a * at**-alpha)


def _per_refit(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """One parameter's refits shaped to broadcast against the points ``at``: a row each."""
    return values.reshape(-1, *([1] * at.ndim))


def geometric_mean(values: ArrayLike) -> float:
    """The centre of positive values spread over orders of magnitude (N, D, C)."""
    return float(np.exp(np.log(np.asarray(values, dtype=float)).mean()))


def _power_law_problem(c: np.ndarray, loss: np.ndarray) -> Problem:
    grid = np.array(
        list(
            itertools.product(
                np.linspace(-1, 1.5, 6), np.arange(0, 31, 2.5), np.linspace(0, 0.8, 9)
            )
        )
    )
    return Problem.build([np.log(c)], np.log(loss), grid)


def power_law_theta(C: np.ndarray, L: np.ndarray, starts: int = LOCAL_STARTS) -> np.ndarray:
    """Raw parameters (log E, log A, alpha) of L(C) from ``starts`` grid starts, no checks.

    For refits inside another bootstrap (the frontier's): few starts, no nested resampling.
    """
    prob = _power_law_problem(C, L)
    return prob.to_raw(solve(prob, best_grid_points(prob, starts))[0])


def fit_loss_vs_compute(
    C: ArrayLike,
    L: ArrayLike,
    n_bootstrap: int = 200,
    seed: int = 0,
    groups: ArrayLike | None = None,
) -> PowerLawFit:
    """Fit L(C) = E + A*C^-alpha (log-space parameters e, a, alpha); needs >= 3 points.

    ``groups``: one label per point (its size); points of a size then share a resampled offset.
    """
    c, loss = _as_arrays("fit_loss_vs_compute", 3, C=C, L=L)
    if np.unique(c).size < 3:
        raise AnalysisError("fit_loss_vs_compute needs >= 3 distinct compute values")
    prob = _power_law_problem(c, loss)
    fit = fit_problem(prob, n_bootstrap, seed, _groups(groups, c.size, "fit_loss_vs_compute"), 3)
    return PowerLawFit.from_samples(
        fit.theta,
        fit.samples,
        c.size,
        fit.objective,
        PowerLawFit.title,
        min_loss=float(loss.min()),
        centre=geometric_mean(c),
    )


# -- L(N, D) -------------------------------------------------------------------------------------


@dataclass
class ChinchillaFit(FitStats):
    """L(N, D) = E + A / N^alpha + B / D^beta (N: non-embedding parameters, D: tokens)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    EXPONENTS = ("alpha", "beta")
    TERMS: ClassVar[dict[str, tuple[str, str]]] = {"A": ("N", "alpha"), "B": ("D", "beta")}
    title: ClassVar[str] = "L(N, D) = E + A / N^alpha + B / D^beta"

    def params(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "B": self.B, "alpha": self.alpha, "beta": self.beta}

    def predict(self, N: ArrayLike | float, D: ArrayLike | float) -> np.ndarray | float:
        n = np.asarray(require_positive("L(N, D).predict: N", N))
        d = np.asarray(require_positive("L(N, D).predict: D", D))
        out = self.E + self.A * n ** (-self.alpha) + self.B * d ** (-self.beta)
        return float(out) if out.ndim == 0 else out

    def predict_frame(self, df: pd.DataFrame) -> np.ndarray:
        return np.asarray(self.predict(df["N"].to_numpy(float), df["tokens"].to_numpy(float)))

    def predict_samples(self, N: ArrayLike | float, D: ArrayLike | float) -> np.ndarray:
        """The bootstrap refits' L(N, D) (empty without a bootstrap): one row per refit, of
        ``N`` and ``D`` broadcast together."""
        s = self.samples
        if not s:
            return np.empty(0)
        n = np.asarray(require_positive("L(N, D).predict_samples: N", N))
        d = np.asarray(require_positive("L(N, D).predict_samples: D", D))
        n, d = np.broadcast_arrays(n, d)
        e, a, alpha, b, beta = (_per_refit(s[k], n) for k in ("E", "A", "alpha", "B", "beta"))
        return e + a * n**-alpha + b * d**-beta

    def predict_interval(
        self, N: ArrayLike | float, D: ArrayLike | float
    ) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
        """The CI_LEVEL interval of :meth:`predict_samples` at each (N, D) (a band: arrays of
        their broadcast shape, for arrays); NaNs without a bootstrap."""
        return prediction_interval(
            self.predict_samples(N, D), np.broadcast_shapes(np.shape(N), np.shape(D))
        )

    @property
    def G(self) -> float:
        self._require_frontier()
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))

    @property
    def a(self) -> float:
        """N_opt grows as C^a on the compute-optimal frontier."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """D_opt grows as C^b on the compute-optimal frontier (a + b = 1)."""
        return self.alpha / (self.alpha + self.beta)

    def optimal_intervals(self, C: float) -> dict[str, tuple[float, float]]:
        """Bootstrap CIs of a, b and of N_opt, D_opt and the loss at C (NaNs without a bootstrap).

        Refits without a frontier (an exponent or coefficient at zero) give no value and are
        left out of the intervals.
        """
        c = require_positive("L(N, D).optimal_intervals: C", C)
        if not self.samples:
            return {k: (math.nan, math.nan) for k in ("a", "b", "N", "D", "loss")}
        frontier = np.all([self.samples[k] > FRONTIER_MIN for k in ("A", "alpha", "B", "beta")], 0)
        s = {name: values[frontier] for name, values in self.samples.items()}
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            total = s["alpha"] + s["beta"]
            g = (s["alpha"] * s["A"] / (s["beta"] * s["B"])) ** (1 / total)
            n_opt = g * (c / 6) ** (s["beta"] / total)
            d_opt = c / (6 * n_opt)
            loss = s["E"] + s["A"] * n_opt ** -s["alpha"] + s["B"] * d_opt ** -s["beta"]
        return {
            "a": percentile_interval(s["beta"] / total),
            "b": percentile_interval(s["alpha"] / total),
            "N": percentile_interval(n_opt),
            "D": percentile_interval(d_opt),
            "loss": percentile_interval(loss),
        }

    @property
    def has_frontier(self) -> bool:
        """A compute-optimal split exists only if loss falls with both N and D."""
        return not self._flat_terms()

    def _flat_terms(self) -> list[str]:
        return [
            f"{name}={value:.3g}"
            for name, value in (
                ("A", self.A),
                ("alpha", self.alpha),
                ("B", self.B),
                ("beta", self.beta),
            )
            if not value > FRONTIER_MIN
        ]

    def _require_frontier(self) -> None:
        flat = self._flat_terms()
        if flat:
            raise AnalysisError(
                f"this L(N, D) fit has {', '.join(flat)}: loss does not fall with both N and D in "
                "the data, so there is no compute-optimal N, D; predict at a given N and D instead, "
                "or add sizes / longer runs"
            )

    def compute_optimal(
        self, C: ArrayLike | float
    ) -> tuple[np.ndarray | float, np.ndarray | float]:
        """(N*, D*) minimising L under C = 6 N D (Hoffmann et al. eq. 4)."""
        c6 = np.asarray(require_positive("L(N, D).compute_optimal: C", C)) / 6
        n_opt = self.G * c6**self.a
        d_opt = c6**self.b / self.G
        if n_opt.ndim == 0:
            return float(n_opt), float(d_opt)
        return n_opt, d_opt

    def optimal_tokens(self, N: float) -> float:
        """D on the compute-optimal frontier for a model of N parameters."""
        n = require_positive("L(N, D).optimal_tokens: N", N)
        c6 = (n / self.G) ** (1 / self.a)
        return float(c6 / n)

    def optimal_params(self, D: float) -> float:
        """N on the compute-optimal frontier for a budget of D tokens."""
        d = require_positive("L(N, D).optimal_params: D", D)
        c6 = (d * self.G) ** (1 / self.b)
        return float(c6 / d)


FRONTIER_MIN = 1e-6
"""Coefficients and exponents at or below this count as zero (fitted to the bound)."""


MIN_RATIO_SPREAD = 1.1
"""Tokens per parameter must vary by more than this factor across the points: a plan's steps,
rounded up to whole batches, move one multiple's D/N by a fraction of a percent."""


def fit_chinchilla(
    N: ArrayLike,
    D: ArrayLike,
    L: ArrayLike,
    n_bootstrap: int = 200,
    seed: int = 0,
    groups: ArrayLike | None = None,
) -> ChinchillaFit:
    """Chinchilla approach 3 on (N, D, L) points: >= 5 points from >= 3 sizes (several D per N help).

    ``groups``: one label per point (its size or run); points of a group then share a resampled
    offset in the bootstrap, as points of one training run share its seed.
    """
    n, d, loss = _as_arrays("fit_chinchilla", 5, N=N, D=D, L=L)
    if np.unique(n).size < 3 or np.unique(d).size < 2:
        raise AnalysisError(
            f"fit_chinchilla needs >= 3 model sizes and >= 2 token counts (got {np.unique(n).size} "
            f"and {np.unique(d).size}): E + A/N^alpha can't be pinned down otherwise"
        )
    ratio = d / n
    if ratio.max() < MIN_RATIO_SPREAD * ratio.min():
        raise AnalysisError(
            f"fit_chinchilla: every point has about the same tokens per parameter (D/N = "
            f"{ratio.min():.3g} .. {ratio.max():.3g}): with D tied to N, L(N, D) can't tell the N "
            "term from the D term; give some sizes points at another D/N (a WSD-S run's decays do)"
        )
    exps = np.arange(0, 2.01, 0.5)
    logs = np.arange(0, 26, 5.0)
    grid = np.array(list(itertools.product(np.arange(-1, 1.6, 0.5), logs, exps, logs, exps)))
    prob = Problem.build([np.log(n), np.log(d)], np.log(loss), grid)
    groups = _groups(groups, n.size, "fit_chinchilla")
    fit = fit_problem(prob, n_bootstrap, seed, groups, CHINCHILLA_SIZE_PARAMS)
    e, a, alpha, b, beta = fit.theta
    s = fit.samples
    named = {
        "E": np.exp(s[:, 0]),
        "A": np.exp(s[:, 1]),
        "B": np.exp(s[:, 3]),
        "alpha": s[:, 2],
        "beta": s[:, 4],
    }
    stats = _fit_stats(named, n.size, fit.objective, fit.theta.size, min_loss=float(loss.min()))
    stats["n_sizes"] = 0 if groups is None else np.unique(groups).size
    stats["centre"] = {"N": geometric_mean(n), "D": geometric_mean(d)}
    return ChinchillaFit(math.exp(e), math.exp(a), math.exp(b), float(alpha), float(beta), **stats)
