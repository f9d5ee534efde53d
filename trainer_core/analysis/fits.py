"""Scaling-law fits: loss vs compute L(C) and the Chinchilla form L(N, D), with bootstrap CIs.

Both laws are a sum of exponentials in log space, log L = logsumexp(theta . x_k), so one fitter
serves both: Huber loss (delta 1e-3) on log L_pred - log L, summed over points (Hoffmann et al.
2022, approach 3), a vectorised pass over a grid of initial values, then L-BFGS-B from the best
grid points. Confidence intervals come from residual resamples (see ``bootstrap.py``), each
refitted from its own best grid points: starting every resample at the full-data optimum would
pull the resamples towards it and shrink the intervals.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from trainer_core.analysis.bootstrap import (
    CI_LEVEL,
    parallel_map,
    percentile_interval,
    residual_resamples,
)
from trainer_core.analysis.load import AnalysisError

HUBER_DELTA = 1e-3
LOCAL_STARTS = 16
"""L-BFGS-B runs per fit: from the best-scoring points of the initial-value grid."""
BOOTSTRAP_STARTS = 2
"""L-BFGS-B runs per bootstrap resample, from that resample's best grid points."""

CHINCHILLA_SIZE_PARAMS = 3
"""Parameters of L(N, D) that differ between sizes (E, A, alpha): they absorb per-size offsets."""

ArrayLike = Sequence[float] | np.ndarray | pd.Series


@dataclass
class _Problem:
    """log L_pred = logsumexp(e, c_1 - p_1 log x_1, c_2 - p_2 log x_2, ...).

    Parameters are theta = (e, c_1, p_1, c_2, p_2, ...) with c_k = log of the k-th coefficient.
    Internally each log x_k is centred on its mean m_k (c_k' = c_k - p_k m_k): the same model,
    but without the strong c/p correlation that makes L-BFGS crawl.
    """

    terms: np.ndarray  # (K, n, P): z_k = terms[k] @ theta' for the centred parameters theta'
    log_loss: np.ndarray  # (n,)
    grid: np.ndarray  # (G, P) initial values, centred
    centres: np.ndarray  # (K - 1,)

    @classmethod
    def build(cls, log_x: list[np.ndarray], log_loss: np.ndarray, grid: np.ndarray) -> _Problem:
        n, k = log_loss.size, len(log_x)
        terms = np.zeros((k + 1, n, 1 + 2 * k))
        terms[0, :, 0] = 1.0
        centres = np.array([lx.mean() for lx in log_x])
        for i, (lx, m) in enumerate(zip(log_x, centres, strict=True), start=1):
            terms[i, :, 2 * i - 1] = 1.0
            terms[i, :, 2 * i] = -(lx - m)
        prob = cls(terms, log_loss, grid, centres)
        prob.grid = prob.to_internal(grid)
        return prob

    def _shift(self, theta: np.ndarray, sign: float) -> np.ndarray:
        out = np.array(theta, dtype=float, copy=True)
        for i, m in enumerate(self.centres, start=1):
            out[..., 2 * i - 1] += sign * out[..., 2 * i] * m
        return out

    def to_internal(self, theta: np.ndarray) -> np.ndarray:
        return self._shift(theta, -1.0)

    def to_raw(self, theta: np.ndarray) -> np.ndarray:
        return self._shift(theta, 1.0)

    def log_pred(self, theta: np.ndarray) -> np.ndarray:
        """log L_pred of every point for centred parameters ``theta``."""
        z = self.terms @ theta
        zmax = z.max(axis=0)
        return zmax + np.log(np.exp(z - zmax).sum(axis=0))

    def with_log_loss(self, log_loss: np.ndarray) -> _Problem:
        return _Problem(self.terms, log_loss, self.grid, self.centres)


def _huber(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    small = np.abs(r) <= HUBER_DELTA
    value = np.where(small, 0.5 * r**2, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA))
    return value, np.where(small, r, HUBER_DELTA * np.sign(r))


def _objective(theta: np.ndarray, prob: _Problem) -> tuple[float, np.ndarray]:
    z = prob.terms @ theta  # (K, n)
    zmax = z.max(axis=0)
    w = np.exp(z - zmax)
    total = w.sum(axis=0)
    resid = zmax + np.log(total) - prob.log_loss
    value, dvalue = _huber(resid)
    weights = w / total  # d log L_pred / d z_k
    grad = np.einsum("kn,knp->p", weights * dvalue, prob.terms)
    # Scaled by 1/delta^2 (same minimiser) so L-BFGS-B's relative tolerances see O(1) values.
    return float(value.sum()) / HUBER_DELTA**2, grad / HUBER_DELTA**2


def _grid_scores(prob: _Problem) -> np.ndarray:
    z = np.einsum("knp,gp->gkn", prob.terms, prob.grid)
    zmax = z.max(axis=1)
    log_pred = zmax + np.log(np.exp(z - zmax[:, None, :]).sum(axis=1))
    return _huber(log_pred - prob.log_loss)[0].sum(axis=1)


def _solve(prob: _Problem, starts: np.ndarray) -> tuple[np.ndarray, float]:
    """The best L-BFGS-B optimum over ``starts``; the first wins ties, however many cores ran them."""
    results = parallel_map(partial(_descend, prob), starts)
    best, best_value = starts[0], math.inf
    for x, value in results:
        if value < best_value:
            best, best_value = x, value
    return best, best_value * HUBER_DELTA**2


def _descend(prob: _Problem, x0: np.ndarray) -> tuple[np.ndarray, float]:
    # Exponents (every other parameter from index 2) stay >= 0.
    bounds = [(0.0, 10.0) if i and i % 2 == 0 else (None, None) for i in range(prob.grid.shape[1])]
    res = minimize(
        _objective,
        x0,
        args=(prob,),
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": 2000, "ftol": 1e-12, "gtol": 1e-8},
    )
    return res.x, float(res.fun)


def _best_grid_points(prob: _Problem, k: int) -> np.ndarray:
    return prob.grid[np.argsort(_grid_scores(prob))[:k]]


@dataclass
class _FitResult:
    """Raw parameters (e, c_1, p_1, ...), the summed Huber loss and the bootstrap refits."""

    theta: np.ndarray
    objective: float
    samples: np.ndarray  # (n_bootstrap, P), empty without a bootstrap


def _fit(
    prob: _Problem, n_bootstrap: int, seed: int, groups: np.ndarray | None, group_params: int
) -> _FitResult:
    """The fit and its bootstrap refits; ``group_params``: parameters that vary between groups."""
    theta, value = _solve(prob, _best_grid_points(prob, LOCAL_STARTS))
    n = prob.log_loss.size
    resamples = residual_resamples(
        prob.log_loss,
        prob.log_pred(theta),
        np.arange(n) if groups is None else groups,
        theta.size,
        n_bootstrap,
        np.random.default_rng(seed),
        theta.size if groups is None else group_params,
    )
    samples = parallel_map(partial(_refit, prob), resamples)
    samples_raw = prob.to_raw(np.array(samples).reshape(len(samples), theta.size))
    return _FitResult(prob.to_raw(theta), value, samples_raw)


def _refit(prob: _Problem, log_loss: np.ndarray) -> np.ndarray:
    """Centred parameters of one bootstrap resample, from its own best grid points."""
    sub = prob.with_log_loss(log_loss)
    return _solve(sub, _best_grid_points(sub, BOOTSTRAP_STARTS))[0]


def _uncertainty(
    samples: dict[str, np.ndarray],
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Std and percentile CI of each parameter's bootstrap values (NaN without a bootstrap)."""
    std = {
        name: float(np.std(v, ddof=1)) if len(v) >= 2 else math.nan for name, v in samples.items()
    }
    return std, {name: percentile_interval(v) for name, v in samples.items()}


def _format(title: str, values: dict[str, float], fit: PowerLawFit | ChinchillaFit) -> str:
    std, ci = fit.std, fit.ci
    lines = [f"{title}   ({fit.n_points} points, {fit.n_bootstrap} bootstrap resamples)"]
    for name, value in values.items():
        line = f"  {name:<6}= {value:.4g}"
        if math.isfinite(std[name]):
            lo, hi = ci[name]
            # A std beyond the value itself is a heavy tail's (A trading off with alpha): the
            # percentile interval says it, the std would only mislead.
            spread = f" ± {std[name]:.2g}" if std[name] < abs(value) else ""
            line += f"{spread}   ({100 * CI_LEVEL:.0f}% CI {lo:.4g} .. {hi:.4g})"
        lines.append(line)
    return "\n".join(lines)


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
class FitStats:
    """What every fit carries besides its parameters: its size, objective and bootstrap."""

    n_points: int
    objective: float
    std: dict[str, float] = field(default_factory=dict)
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    n_bootstrap: int = 0
    samples: dict[str, np.ndarray] = field(default_factory=dict, repr=False)


def _fit_stats(named: dict[str, np.ndarray], n_points: int, objective: float) -> dict:
    """FitStats fields from the bootstrap refits' named parameter samples."""
    std, ci = _uncertainty(named)
    n_bootstrap = len(next(iter(named.values()))) if named else 0
    return {
        "n_points": n_points,
        "objective": objective,
        "std": std,
        "ci": ci,
        "n_bootstrap": n_bootstrap,
        "samples": named,
    }


@dataclass
class PowerLawFit(FitStats):
    """L(C) = E + A * C^(-alpha), C in FLOPs; ``samples``: the bootstrap refits' parameters."""

    E: float
    A: float
    alpha: float
    title: str = "L(C) = E + A * C^-alpha"

    EXPONENTS = ("alpha",)

    @classmethod
    def from_samples(
        cls, theta: np.ndarray, samples: np.ndarray, n_points: int, objective: float, title: str
    ) -> PowerLawFit:
        """From raw parameters (e, log A, alpha) and an (n_bootstrap, 3) array of refits."""
        named = {"E": np.exp(samples[:, 0]), "A": np.exp(samples[:, 1]), "alpha": samples[:, 2]}
        e, a, alpha = theta
        stats = _fit_stats(named, n_points, objective)
        return cls(math.exp(e), math.exp(a), float(alpha), title=title, **stats)

    def params(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "alpha": self.alpha}

    def predict(self, C: ArrayLike | float) -> np.ndarray | float:
        c = np.asarray(C, dtype=float)
        out = self.E + self.A * c ** (-self.alpha)
        return float(out) if out.ndim == 0 else out

    def predict_frame(self, df: pd.DataFrame) -> np.ndarray:
        return np.asarray(self.predict(df["flops"].to_numpy(float)))

    def predict_interval(self, C: float) -> tuple[float, float]:
        """The bootstrap refits' CI_LEVEL interval of L(C) (NaNs without a bootstrap)."""
        s = self.samples
        if not s:
            return math.nan, math.nan
        return percentile_interval(s["E"] + s["A"] * float(C) ** (-s["alpha"]))

    def __str__(self) -> str:
        return _format(self.title, self.params(), self)


def _power_law_problem(c: np.ndarray, loss: np.ndarray) -> _Problem:
    grid = np.array(
        list(
            itertools.product(
                np.linspace(-1, 1.5, 6), np.arange(0, 31, 2.5), np.linspace(0, 0.8, 9)
            )
        )
    )
    return _Problem.build([np.log(c)], np.log(loss), grid)


def power_law_theta(C: np.ndarray, L: np.ndarray, starts: int = LOCAL_STARTS) -> np.ndarray:
    """Raw parameters (log E, log A, alpha) of L(C) from ``starts`` grid starts, no checks.

    For refits inside another bootstrap (the frontier's): few starts, no nested resampling.
    """
    prob = _power_law_problem(C, L)
    return prob.to_raw(_solve(prob, _best_grid_points(prob, starts))[0])


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
    fit = _fit(prob, n_bootstrap, seed, _groups(groups, c.size, "fit_loss_vs_compute"), 3)
    return PowerLawFit.from_samples(
        fit.theta, fit.samples, c.size, fit.objective, PowerLawFit.title
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

    def params(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "B": self.B, "alpha": self.alpha, "beta": self.beta}

    def predict(self, N: ArrayLike | float, D: ArrayLike | float) -> np.ndarray | float:
        n, d = np.asarray(N, dtype=float), np.asarray(D, dtype=float)
        out = self.E + self.A * n ** (-self.alpha) + self.B * d ** (-self.beta)
        return float(out) if out.ndim == 0 else out

    def predict_frame(self, df: pd.DataFrame) -> np.ndarray:
        return np.asarray(self.predict(df["N"].to_numpy(float), df["tokens"].to_numpy(float)))

    def predict_interval(self, N: float, D: float) -> tuple[float, float]:
        """The bootstrap refits' CI_LEVEL interval of L(N, D) (NaNs without a bootstrap)."""
        s = self.samples
        if not s:
            return math.nan, math.nan
        return percentile_interval(
            s["E"] + s["A"] * float(N) ** (-s["alpha"]) + s["B"] * float(D) ** (-s["beta"])
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
        s = self.samples
        if not s:
            return {k: (math.nan, math.nan) for k in ("a", "b", "N", "D", "loss")}
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            total = s["alpha"] + s["beta"]
            g = (s["alpha"] * s["A"] / (s["beta"] * s["B"])) ** (1 / total)
            n_opt = g * (float(C) / 6) ** (s["beta"] / total)
            d_opt = float(C) / (6 * n_opt)
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
        c6 = np.asarray(C, dtype=float) / 6
        n_opt = self.G * c6**self.a
        d_opt = c6**self.b / self.G
        if n_opt.ndim == 0:
            return float(n_opt), float(d_opt)
        return n_opt, d_opt

    def frontier_loss(self, C: ArrayLike | float) -> np.ndarray | float:
        """L at the compute-optimal N, D of each budget: the law's own frontier L(C)."""
        n_opt, d_opt = self.compute_optimal(C)
        return self.predict(n_opt, d_opt)

    def optimal_tokens(self, N: float) -> float:
        """D on the compute-optimal frontier for a model of N parameters."""
        c6 = (N / self.G) ** (1 / self.a)
        return float(c6 / N)

    def optimal_params(self, D: float) -> float:
        """N on the compute-optimal frontier for a budget of D tokens."""
        c6 = (D * self.G) ** (1 / self.b)
        return float(c6 / D)

    def __str__(self) -> str:
        title = "L(N, D) = E + A / N^alpha + B / D^beta"
        return _format(title, self.params(), self)


FRONTIER_MIN = 1e-6
"""Coefficients and exponents at or below this count as zero (fitted to the bound)."""


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
    exps = np.arange(0, 2.01, 0.5)
    logs = np.arange(0, 26, 5.0)
    grid = np.array(list(itertools.product(np.arange(-1, 1.6, 0.5), logs, exps, logs, exps)))
    prob = _Problem.build([np.log(n), np.log(d)], np.log(loss), grid)
    groups = _groups(groups, n.size, "fit_chinchilla")
    fit = _fit(prob, n_bootstrap, seed, groups, CHINCHILLA_SIZE_PARAMS)
    e, a, alpha, b, beta = fit.theta
    s = fit.samples
    named = {
        "E": np.exp(s[:, 0]),
        "A": np.exp(s[:, 1]),
        "B": np.exp(s[:, 3]),
        "alpha": s[:, 2],
        "beta": s[:, 4],
    }
    stats = _fit_stats(named, n.size, fit.objective)
    return ChinchillaFit(math.exp(e), math.exp(a), math.exp(b), float(alpha), float(beta), **stats)
