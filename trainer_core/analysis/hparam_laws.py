"""Hyperparameter scaling laws: LR*(N, D) and B*(D) (or B*(N, D)) fitted from sweeps, with
intervals, flags for what the data leave open, and a held-out check.

Two stages. Each (N, D) cell of a sweep gets its optimum from a parabola in log LR (or log
batch) through the lowest points of its curve; a bootstrap of the loss noise gives its interval.
The cells' optima then get a power law c N^a D^b, fitted by least squares in log space weighted
by those intervals, and a bootstrap of the law gives intervals for c, a, b and for predictions.
D's exponent is fitted with its sign free: published laws disagree on it (Step Law's LR* grows
with the horizon, Bjorck et al.'s falls).

Input: one row per trial at one eval point, columns N, D (tokens at that point), lr, batch
(tokens) and loss, optionally ``stopped``. Rows marked stopped are left out (an un-annealed
loss); a loss of +inf is a value tried and judged worse (a trial that early stopping ended, or
that diverged, before this horizon: :data:`~trainer_core.analysis.optimum.ENDED_WORSE`): it
brackets a cell's optimum, never fitted; NaN and -inf losses are left out.
:func:`~trainer_core.analysis.hparam_table.hparam_table` builds it from a sweep dir.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from trainer_core.analysis.bootstrap import CI_LEVEL, Z_CI, percentile_interval
from trainer_core.analysis.checks import format_flags
from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.optimum import N_BOOTSTRAP, grid_optimum, not_bracketed, pooled_noise

Param = Literal["lr", "batch"]
COLUMNS = ("N", "D", "lr", "batch", "loss")
SIGMA_FLOOR = 0.02
"""No cell pins its optimum better than 2% (in log units): without a floor, a cell whose few
points happen to lie on a parabola would get all the weight of the law's fit."""
MISFIT_SCATTER = 2.0
"""Cells straying from the law by more than this many times their own intervals: the law's form
misses something (a term, a bend), beyond what widening its intervals fixes."""
SYMBOL = {"lr": "lr*", "batch": "B*"}
OTHER: dict[Param, Param] = {"lr": "batch", "batch": "lr"}
"""The hyperparameter swept beside each: its best value decides whether an optimum is joint."""


@dataclass
class CellOptimum(ShownAsText):
    """The optimal LR (or batch) of one (N, D) cell, with its 95% interval.

    ``method``: "quadratic" (vertex of a parabola in log ``param`` through the lowest points)
    or "grid" (the lowest point itself, its interval the neighbouring grid values).
    """

    N: float
    D: float
    param: Param
    value: float
    low: float
    high: float
    loss: float
    method: Literal["quadratic", "grid"]
    at_edge: bool
    """The lowest loss is at the smallest or largest value tried: the optimum is not bracketed,
    so it may lie beyond the grid; the interval is open on that side (0 or inf)."""
    n_points: int
    """Distinct values of ``param`` tried in the cell."""
    conditional: str = ""
    """Where the cell's best trial sits at the edge of the *other* hyperparameter's grid (batch
    for an LR cell, LR for a batch cell): "batch 2048, the largest tried". The optimum is then
    the best at that edge, the joint optimum's only if it does not move with the other one
    (:attr:`HparamLawFit.conditional` says so). Empty when the other was not swept, or its best
    is inside its grid."""

    @property
    def log_sigma(self) -> float:
        """The interval's half-width in log units, as a normal standard deviation."""
        if not (self.low > 0 and math.isfinite(self.high)):
            return math.inf
        return (math.log(self.high) - math.log(self.low)) / (2 * Z_CI)

    @property
    def label(self) -> str:
        return f"N={self.N:.3g} D={self.D:.3g}"

    def __str__(self) -> str:
        line = (
            f"{self.label}: {SYMBOL[self.param]} = {self.value:.4g} "
            f"[{self.low:.4g}, {self.high:.4g}], loss {self.loss:.4f} "
            f"({self.method}, {self.n_points} values)"
        )
        if self.at_edge:
            line += f"  {not_bracketed(self.param, self.low)}"
        if self.conditional:
            line += f"  CONDITIONAL: best trial at {self.conditional}: widen that grid"
        return line


def horizons_per_size(cells: list[CellOptimum]) -> int:
    """The most distinct horizons D any one size's bracketed cells cover: a law in D needs 2."""
    usable = [c for c in cells if not c.at_edge]
    return max((len({c.D for c in usable if n == c.N}) for n in {c.N for c in usable}), default=0)


def outside_cells(
    cells: list[CellOptimum], N: float, D: float, terms: tuple[str, ...] = ("N", "D")
) -> tuple[str, ...]:
    """Which of ``terms`` lie outside the cells' range at (N, D), and "D/N" when both are
    terms and the tokens per parameter do: a prediction there extrapolates in them (N and D
    each inside their ranges can still pair far from any cell, 2 tokens a parameter from cells
    of 20 to 180)."""
    where = {"N": N, "D": D}
    outside = [
        t
        for t in terms
        if not min(getattr(c, t) for c in cells) <= where[t] <= max(getattr(c, t) for c in cells)
    ]
    if {"N", "D"} <= set(terms):
        ratios = [c.D / c.N for c in cells]
        if not min(ratios) <= D / N <= max(ratios):
            outside.append("D/N")
    return tuple(outside)


def _usable(df: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise AnalysisError(f"hyperparameter sweep table lacks columns {missing}; needs {COLUMNS}")
    for column in ("N", "D"):
        values = df[column].astype(float)
        bad = values[~(np.isfinite(values) & (values > 0))]
        if len(bad):
            raise AnalysisError(
                f"hyperparameter sweep table: {column} must be a positive number of "
                f"{'parameters' if column == 'N' else 'tokens'}; row {bad.index[0]!r} has "
                f"{bad.iloc[0]!r}: fix or drop the row"
            )
    loss = df["loss"].astype(float)
    keep = (np.isfinite(loss) | (loss == np.inf)) & (df["lr"] > 0) & (df["batch"] > 0)
    if "stopped" in df.columns:
        keep &= ~df["stopped"].eq(True)
    return df[keep]


class Curve(NamedTuple):
    """One cell's curve: x the log values of ``param`` ascending, y the lowest loss at each."""

    N: float
    D: float
    x: np.ndarray
    y: np.ndarray
    conditional: str
    """:attr:`CellOptimum.conditional` of the cell."""


def _curves(df: pd.DataFrame, param: Param) -> list[Curve]:
    """The curve of every cell that varies ``param``. Where LR and batch are both swept, the
    lowest loss over the other one traces the curve through the joint optimum, so its vertex is
    the joint optimum's LR (or batch), provided the best trial's other value is inside the
    other's grid; where it is at that grid's edge, the curve is the one at the edge value."""
    other = OTHER[param]
    out = []
    for (n, d), rows in _usable(df).groupby(["N", "D"]):
        best = rows.groupby(param)["loss"].min().sort_index()
        if len(best) < 2:
            continue
        tried = np.sort(rows[other].unique())
        at = rows.loc[rows["loss"].idxmin(), other]
        conditional = ""
        if len(tried) >= 2 and at in (tried[0], tried[-1]):
            side = "smallest" if at == tried[0] else "largest"
            conditional = f"{other} {at:.4g}, the {side} tried"
        x, y = np.log(best.index.to_numpy(float)), best.to_numpy()
        out.append(Curve(float(n), float(d), x, y, conditional))
    return out


def _cell(
    curve: Curve, param: Param, noise: float, n_bootstrap: int, rng: np.random.Generator
) -> CellOptimum:
    best = grid_optimum(curve.x, curve.y, noise, n_bootstrap, rng)
    return CellOptimum(curve.N, curve.D, param, *best, conditional=curve.conditional)


def cell_optima(
    df: pd.DataFrame, param: Param = "lr", n_bootstrap: int = N_BOOTSTRAP, seed: int = 0
) -> list[CellOptimum]:
    """The optimum of ``param`` in every (N, D) cell that tries more than one value of it,
    sorted by N then D. Intervals: the window's parabola refitted to its fitted values plus
    Gaussian noise at the sweep's pooled residual level, the vertices' central 95%; without any
    spare point to estimate the noise, the neighbouring grid values."""
    curves = _curves(df, param)
    noise = pooled_noise([(c.x, c.y) for c in curves])
    rng = np.random.default_rng(seed)
    return [_cell(curve, param, noise, n_bootstrap, rng) for curve in curves]


@dataclass
class HparamLawFit(ShownAsText):
    """``param``*(N, D) = c N^a D^b over the bracketed cells (weighted least squares in log
    space). Terms the data cannot resolve are left out of ``terms`` and named in ``notes``."""

    param: Param
    terms: tuple[str, ...]
    c: float
    exponents: dict[str, float]
    ci: dict[str, tuple[float, float]]
    """95% intervals of "c" and of each fitted term's exponent ("N": a, "D": b)."""
    draws: np.ndarray = field(repr=False)
    """(n_bootstrap, 1 + len(terms)): log c and the exponents of each bootstrap refit."""
    cells: list[CellOptimum] = field(repr=False)
    excluded: list[CellOptimum] = field(repr=False)
    scatter: float
    """The cells' spread about the law in units of their own intervals (chi^2 per degree of
    freedom, square-rooted; 1 when none is spare). Where it says more than their intervals do,
    the law's intervals are widened for it (:attr:`WeightedLogFit.widening`)."""
    notes: list[str] = field(default_factory=list)

    @property
    def a(self) -> float:
        """The exponent of N (NaN when not fitted)."""
        return self.exponents.get("N", math.nan)

    @property
    def b(self) -> float:
        """The exponent of D (NaN when not fitted)."""
        return self.exponents.get("D", math.nan)

    def log_row(self, N: float, D: float) -> np.ndarray:
        """[1, log N, log D] in this law's terms: the row its bootstrap draws multiply."""
        return np.array([1.0] + [math.log({"N": N, "D": D}[t]) for t in self.terms])

    def predict(self, N: float, D: float) -> tuple[float, float, float]:
        """(value, 95% low, 95% high) at (N, D): the law and its bootstrap refits there."""
        x = self.log_row(N, D)
        point = math.log(self.c) + sum(
            self.exponents[t] * v for t, v in zip(self.terms, x[1:], strict=True)
        )
        lo, hi = percentile_interval(self.draws @ x)
        return math.exp(point), math.exp(lo), math.exp(hi)

    def outside(self, N: float, D: float) -> tuple[str, ...]:
        """Which of this law's factors lie outside its cells at (N, D)."""
        return outside_cells(self.cells, N, D, self.terms)

    @property
    def name(self) -> str:
        """ "lr*(N, D)", "B*(D)": which law, by its factors."""
        return f"{SYMBOL[self.param]}({', '.join(self.terms)})"

    @property
    def formula(self) -> str:
        return f"{self.name} = {self.c:.4g}" + "".join(
            f" * {t}^{self.exponents[t]:+.4f}" for t in self.terms
        )

    def __str__(self) -> str:
        law = self.formula
        ranges = [f"c [{self.ci['c'][0]:.3g}, {self.ci['c'][1]:.3g}]"] + [
            f"{'a' if t == 'N' else 'b'} [{self.ci[t][0]:+.3f}, {self.ci[t][1]:+.3f}]"
            for t in self.terms
        ]
        lines = [
            f"{law}   95%: {', '.join(ranges)}   "
            f"[{len(self.cells)} cells, scatter {self.scatter:.2f}x their intervals]"
        ]
        if self.notes:
            lines.append(format_flags(self.notes, "UNRESOLVED"))
        if self.misfit:
            lines.append(f"  {self.misfit}")
        if self.excluded:
            names = "; ".join(c.label for c in self.excluded)
            lines.append(f"  EXCLUDED (optimum at the grid's edge, not bracketed): {names}")
        if self.conditional:
            lines.append(f"  {self.conditional}")
        return "\n".join(lines)

    @property
    def misfit(self) -> str:
        """One line when the cells stray from the law by more than :data:`MISFIT_SCATTER` times
        their intervals, else empty."""
        if self.scatter <= MISFIT_SCATTER:
            return ""
        return (
            f"MISFIT: the cells stray {self.scatter:.1f}x their intervals from the law "
            "(its intervals are widened by that); a missing term or a bend?"
        )

    @property
    def flags(self) -> list[str]:
        """The MISFIT and CONDITIONAL lines: what a value read off the law must be shown with."""
        return [line for line in (self.misfit, self.conditional) if line]

    @property
    def conditional(self) -> str:
        """One line when some cells' optima are the best at the other hyperparameter's grid
        edge (:attr:`CellOptimum.conditional`), else empty."""
        cells = [c for c in self.cells if c.conditional]
        if not cells:
            return ""
        other = OTHER[self.param]
        return (
            f"CONDITIONAL: in {len(cells)} of {len(self.cells)} cells the best trial's {other} "
            f"is at its grid's edge ({'; '.join(c.label for c in cells)}): there the law gives "
            f"the {SYMBOL[self.param]} of that {other}, the joint optimum's only if it does not "
            f"move with {other}; widen the {other} grid"
        )


def _terms(cells: list[CellOptimum], wanted: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The terms of ``wanted`` the cells resolve, and a note for each that they don't. N's
    exponent needs two sizes; D's needs two horizons of one size, or it cannot be told from N's
    (a ladder's D grows with N) and the law of N alone absorbs it."""
    notes = []
    terms = list(wanted)
    sizes = {c.N for c in cells}
    if "N" in terms and len(sizes) < 2:
        terms.remove("N")
        notes.append(f"a (N's exponent): every usable cell has N = {cells[0].N:.3g}; not fitted")
    if "D" in terms:
        horizons = {n: {c.D for c in cells if n == c.N} for n in sizes}
        one_d_per_n = all(len(ds) < 2 for ds in horizons.values())
        if "N" in terms and one_d_per_n:
            terms.remove("D")
            notes.append(
                "b (D's exponent): one D per N, so D's effect cannot be told from N's; "
                "not fitted (the N law absorbs it): sweep two horizons of one size"
            )
        elif "N" not in terms and len({c.D for c in cells}) < 2:
            terms.remove("D")
            notes.append(f"b (D's exponent): every usable cell has D = {cells[0].D:.3g}")
    return tuple(terms), notes


class WeightedLogFit(NamedTuple):
    """Least squares in log space, each point weighted by its own interval: the one fit behind
    a law of the cells (:func:`fit_hparam_law`) and LR*(N) of a sweep's sizes
    (:func:`~trainer_core.analysis.lr.fit_lr_power_law`), so both give one estimate, scatter
    and widening from the same optima."""

    beta: np.ndarray
    solve: np.ndarray
    """Maps y / sigma to ``beta``: its bootstrap refits reuse it."""
    sigma: np.ndarray
    """Each point's sigma in log units, floored at :data:`SIGMA_FLOOR`."""
    scatter: float
    """The points' spread about the fit in units of their sigmas (chi^2 per degree of freedom,
    square-rooted; NaN when none is spare)."""
    dof: int

    @property
    def unscaled_cov(self) -> np.ndarray:
        """The coefficients' covariance the points' own sigmas give."""
        return self.solve @ self.solve.T

    @property
    def widening(self) -> float:
        """The factor on the points' own intervals: the wider of theirs (normal) and the
        scatter's (Student's t on :attr:`dof`, its scale estimated). Continuous in the scatter,
        and never narrower than the points' intervals allow: optima lying exactly on a line do
        not make the law exact; with few points to spare the scatter's scale is itself
        uncertain (1 dof: a "2 sigma" gap 30% of the time, not 5%)."""
        if self.dof < 1:
            return 1.0
        return max(1.0, float(student_t.ppf(0.5 + CI_LEVEL / 2, self.dof)) * self.scatter / Z_CI)


def weighted_log_fit(X: np.ndarray, y: np.ndarray, log_sigma: np.ndarray) -> WeightedLogFit:
    """Fit y (log values) on the design X (its columns 1 and log factors), weights 1 / sigma^2
    with sigma floored at :data:`SIGMA_FLOOR`."""
    sigma = np.maximum(np.broadcast_to(np.asarray(log_sigma, float), y.shape), SIGMA_FLOOR)
    solve = np.linalg.pinv(X / sigma[:, None])
    beta = solve @ (y / sigma)
    dof = len(y) - X.shape[1]
    chi2 = float(np.sum(((y - X @ beta) / sigma) ** 2))
    return WeightedLogFit(beta, solve, sigma, math.sqrt(chi2 / dof) if dof > 0 else math.nan, dof)


def fit_hparam_law(
    cells: list[CellOptimum],
    terms: tuple[str, ...] = ("N", "D"),
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> HparamLawFit:
    """c N^a D^b (``terms`` picks the factors) through the bracketed cells' optima.

    Weights: 1 / the cells' log-interval variance (floored at SIGMA_FLOOR). The bootstrap draws
    each cell's optimum about the law with its own sigma, widened when the cells stray from the
    law by more than their intervals say (:attr:`WeightedLogFit.widening`), and refits.
    """
    if not cells:
        raise AnalysisError("fit_hparam_law: no cell optima (no cell varies this parameter)")
    usable = [c for c in cells if not c.at_edge and math.isfinite(c.log_sigma)]
    excluded = [c for c in cells if c.at_edge or not math.isfinite(c.log_sigma)]
    if not usable:
        names = "; ".join(c.label for c in excluded)
        raise AnalysisError(f"no cell brackets its {cells[0].param} optimum ({names}): widen grids")
    fitted, notes = _terms(usable, terms)
    y = np.log([c.value for c in usable])
    X = np.stack(
        [np.ones(len(usable))] + [np.log([getattr(c, t) for c in usable]) for t in fitted], axis=1
    )
    fit = weighted_log_fit(X, y, np.array([c.log_sigma for c in usable]))
    beta = fit.beta
    if fit.dof == 0:
        notes.append("as many cells as parameters: the law's intervals are the cells' alone")
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((n_bootstrap, len(y))) * fit.sigma * fit.widening
    draws = ((X @ beta + noise) / fit.sigma) @ fit.solve.T
    ci = {"c": tuple(math.exp(v) for v in percentile_interval(draws[:, 0]))}
    exponents = {}
    for k, t in enumerate(fitted, start=1):
        exponents[t] = float(beta[k])
        ci[t] = percentile_interval(draws[:, k])
        lo, hi = ci[t]
        if lo < 0 < hi:
            name = "a (N's exponent)" if t == "N" else "b (D's exponent)"
            notes.append(
                f"{name} = {beta[k]:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}] spans zero: "
                "sign not resolved"
            )
    return HparamLawFit(
        usable[0].param,
        fitted,
        math.exp(beta[0]),
        exponents,
        ci,
        draws,
        usable,
        excluded,
        fit.scatter if fit.dof > 0 else 1.0,
        notes,
    )


@dataclass
class HparamPrediction(ShownAsText):
    """LR* and B* at one (N, D), each with the 95% interval of its law's bootstrap."""

    N: float
    D: float
    lr: tuple[float, float, float]
    batch: tuple[float, float, float] | None
    extrapolated: list[str]
    """Which of N and D lie outside the fitted cells' range."""

    def __str__(self) -> str:
        lr, lo, hi = self.lr
        line = f"N={self.N:.3g} D={self.D:.3g}: lr* = {lr:.4g} (95% {lo:.4g} .. {hi:.4g})"
        if self.batch is not None:
            b, blo, bhi = self.batch
            line += f", B* = {b:.4g} tokens (95% {blo:.4g} .. {bhi:.4g})"
        if self.extrapolated:
            line += f"  [extrapolated in {', '.join(self.extrapolated)}]"
        return line


@dataclass
class HparamLaws(ShownAsText):
    """The cells' optima and the laws through them: LR*(N, D) and, when batch is swept, B*."""

    lr_cells: list[CellOptimum]
    batch_cells: list[CellOptimum]
    lr: HparamLawFit
    batch: HparamLawFit | None

    def predict(self, N: float, D: float) -> HparamPrediction:
        outside = list(
            outside_cells(self.lr.cells + (self.batch.cells if self.batch else []), N, D)
        )
        batch = self.batch.predict(N, D) if self.batch else None
        return HparamPrediction(N, D, self.lr.predict(N, D), batch, outside)

    def __str__(self) -> str:
        lines = ["LR optimum per (N, D) cell:", *(f"  {c}" for c in self.lr_cells), str(self.lr)]
        if self.batch is not None:
            lines += ["Batch optimum per (N, D) cell:", *(f"  {c}" for c in self.batch_cells)]
            lines.append(str(self.batch))
        elif self.batch_cells:
            lines += ["Batch optimum per (N, D) cell:", *(f"  {c}" for c in self.batch_cells)]
            lines.append("B*: no law: no cell brackets its batch optimum; widen the batch grid")
        else:
            lines.append("B*: no cell varies the batch")
        return "\n".join(lines)


def fit_hparam_laws(
    df: pd.DataFrame,
    lr_terms: tuple[str, ...] = ("N", "D"),
    batch_terms: tuple[str, ...] = ("D",),
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> HparamLaws:
    """Cell optima and laws of a sweep table (columns N, D, lr, batch, loss[, stopped]).
    B* defaults to a law of D alone (Power Lines, Step Law: it does not depend on N). No B* law
    (``batch`` None, said in the text) when no cell varies the batch or none brackets its
    optimum: a small sweep's best batch can sit at the grid's edge in every cell, and the LR law
    still stands.

    One ``seed`` for every cell and law, as the ladder's plan and the sweep's report use
    (:class:`~trainer_core.analysis.hparam_table.SweepCells`, :func:`fit_hparam_law`'s
    default): the same sweep then gives every caller the same law."""
    lr_cells = cell_optima(df, "lr", n_bootstrap, seed)
    batch_cells = cell_optima(df, "batch", n_bootstrap, seed)
    lr = fit_hparam_law(lr_cells, lr_terms, n_bootstrap, seed)
    bracketed = any(not c.at_edge and math.isfinite(c.log_sigma) for c in batch_cells)
    batch = fit_hparam_law(batch_cells, batch_terms, n_bootstrap, seed) if bracketed else None
    return HparamLaws(lr_cells, batch_cells, lr, batch)
