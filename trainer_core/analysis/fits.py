"""Scaling-law fits: loss vs compute L(C) and the Chinchilla form L(N, D), with bootstrap CIs.

Both laws are a sum of exponentials in log space, log L = logsumexp(theta . x_k), so one fitter
serves both: Huber loss (delta 1e-3) on log L_pred - log L, summed over points (Hoffmann et al.
2022, approach 3), a vectorised pass over a grid of initial values, then L-BFGS-B from the best
grid points. Confidence intervals come from refitting on points resampled with replacement.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from trainer_core.analysis.load import AnalysisError

HUBER_DELTA = 1e-3
CI_LEVEL = 0.95
LOCAL_STARTS = 16
"""L-BFGS-B runs per fit: from the best-scoring points of the initial-value grid."""
BOOTSTRAP_STARTS = 1
"""Per bootstrap resample: the full-data optimum plus this many of the resample's best grid points."""

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

    def subset(self, idx: np.ndarray) -> _Problem:
        return _Problem(self.terms[:, idx], self.log_loss[idx], self.grid, self.centres)


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
    # Exponents (every other parameter from index 2) stay >= 0.
    bounds = [(0.0, 10.0) if i and i % 2 == 0 else (None, None) for i in range(prob.grid.shape[1])]
    best, best_value = starts[0], math.inf
    for x0 in starts:
        res = minimize(
            _objective,
            x0,
            args=(prob,),
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
            options={"maxiter": 2000, "ftol": 1e-12, "gtol": 1e-8},
        )
        if res.fun < best_value:
            best, best_value = res.x, float(res.fun)
    return best, best_value * HUBER_DELTA**2


def _best_grid_points(prob: _Problem, k: int) -> np.ndarray:
    return prob.grid[np.argsort(_grid_scores(prob))[:k]]


@dataclass
class _FitResult:
    """Raw parameters (e, c_1, p_1, ...), the summed Huber loss and the bootstrap refits."""

    theta: np.ndarray
    objective: float
    samples: np.ndarray  # (n_bootstrap, P), empty without a bootstrap


def _fit(prob: _Problem, n_bootstrap: int, seed: int) -> _FitResult:
    theta, value = _solve(prob, _best_grid_points(prob, LOCAL_STARTS))
    rng = np.random.default_rng(seed)
    n = prob.log_loss.size
    samples = []
    for _ in range(n_bootstrap):
        sub = prob.subset(rng.integers(0, n, size=n))
        starts = np.vstack([theta, _best_grid_points(sub, BOOTSTRAP_STARTS)])
        samples.append(_solve(sub, starts)[0])
    samples_raw = prob.to_raw(np.array(samples).reshape(len(samples), theta.size))
    return _FitResult(prob.to_raw(theta), value, samples_raw)


def _uncertainty(
    samples: dict[str, np.ndarray],
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Std and percentile CI of each parameter's bootstrap values (NaN without a bootstrap)."""
    std, ci = {}, {}
    tail = 100 * (1 - CI_LEVEL) / 2
    for name, values in samples.items():
        if len(values) < 2:
            std[name], ci[name] = math.nan, (math.nan, math.nan)
        else:
            std[name] = float(np.std(values, ddof=1))
            lo, hi = np.percentile(values, [tail, 100 - tail])
            ci[name] = (float(lo), float(hi))
    return std, ci


def _format(title: str, values: dict[str, float], fit: PowerLawFit | ChinchillaFit) -> str:
    std, ci = fit.std, fit.ci
    lines = [f"{title}   ({fit.n_points} points, {fit.n_bootstrap} bootstrap resamples)"]
    for name, value in values.items():
        line = f"  {name:<6}= {value:.4g}"
        if math.isfinite(std[name]):
            lo, hi = ci[name]
            line += f" ± {std[name]:.2g}   ({100 * CI_LEVEL:.0f}% CI {lo:.4g} .. {hi:.4g})"
        lines.append(line)
    return "\n".join(lines)


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


@dataclass
class PowerLawFit:
    """L(C) = E + A * C^(-alpha), C in FLOPs."""

    E: float
    A: float
    alpha: float
    n_points: int
    objective: float
    std: dict[str, float] = field(default_factory=dict)
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    n_bootstrap: int = 0

    def predict(self, C: ArrayLike | float) -> np.ndarray | float:
        c = np.asarray(C, dtype=float)
        out = self.E + self.A * c ** (-self.alpha)
        return float(out) if out.ndim == 0 else out

    def predict_frame(self, df: pd.DataFrame) -> np.ndarray:
        return np.asarray(self.predict(df["flops"].to_numpy(float)))

    def __str__(self) -> str:
        values = {"E": self.E, "A": self.A, "alpha": self.alpha}
        return _format("L(C) = E + A * C^-alpha", values, self)


def fit_loss_vs_compute(
    C: ArrayLike, L: ArrayLike, n_bootstrap: int = 200, seed: int = 0
) -> PowerLawFit:
    """Fit L(C) = E + A*C^-alpha (log-space parameters e, a, alpha); needs >= 3 points."""
    c, loss = _as_arrays("fit_loss_vs_compute", 3, C=C, L=L)
    if np.unique(c).size < 3:
        raise AnalysisError("fit_loss_vs_compute needs >= 3 distinct compute values")
    grid = np.array(
        list(
            itertools.product(
                np.linspace(-1, 1.5, 6), np.arange(0, 31, 2.5), np.linspace(0, 0.8, 9)
            )
        )
    )
    prob = _Problem.build([np.log(c)], np.log(loss), grid)
    fit = _fit(prob, n_bootstrap, seed)
    e, a, alpha = fit.theta
    s = fit.samples
    std, ci = _uncertainty({"E": np.exp(s[:, 0]), "A": np.exp(s[:, 1]), "alpha": s[:, 2]})
    return PowerLawFit(
        math.exp(e), math.exp(a), float(alpha), c.size, fit.objective, std, ci, n_bootstrap
    )


# -- L(N, D) -------------------------------------------------------------------------------------


@dataclass
class ChinchillaFit:
    """L(N, D) = E + A / N^alpha + B / D^beta (N: non-embedding parameters, D: tokens)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    n_points: int
    objective: float
    std: dict[str, float] = field(default_factory=dict)
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    n_bootstrap: int = 0

    def predict(self, N: ArrayLike | float, D: ArrayLike | float) -> np.ndarray | float:
        n, d = np.asarray(N, dtype=float), np.asarray(D, dtype=float)
        out = self.E + self.A * n ** (-self.alpha) + self.B * d ** (-self.beta)
        return float(out) if out.ndim == 0 else out

    def predict_frame(self, df: pd.DataFrame) -> np.ndarray:
        return np.asarray(self.predict(df["N"].to_numpy(float), df["tokens"].to_numpy(float)))

    @property
    def G(self) -> float:
        self._require_frontier()
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))

    def _require_frontier(self) -> None:
        """A compute-optimal split exists only if loss falls with both N and D."""
        flat = [
            f"{name}={value:.3g}"
            for name, value in (
                ("A", self.A),
                ("alpha", self.alpha),
                ("B", self.B),
                ("beta", self.beta),
            )
            if not value > FRONTIER_MIN
        ]
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
        s = self.alpha + self.beta
        n_opt = self.G * c6 ** (self.beta / s)
        d_opt = c6 ** (self.alpha / s) / self.G
        if n_opt.ndim == 0:
            return float(n_opt), float(d_opt)
        return n_opt, d_opt

    def optimal_tokens(self, N: float) -> float:
        """D on the compute-optimal frontier for a model of N parameters."""
        s = self.alpha + self.beta
        c6 = (N / self.G) ** (s / self.beta)
        return float(c6 / N)

    def optimal_params(self, D: float) -> float:
        """N on the compute-optimal frontier for a budget of D tokens."""
        c6 = (D * self.G) ** ((self.alpha + self.beta) / self.alpha)
        return float(c6 / D)

    def __str__(self) -> str:
        values = {"E": self.E, "A": self.A, "B": self.B, "alpha": self.alpha, "beta": self.beta}
        title = "L(N, D) = E + A / N^alpha + B / D^beta"
        return _format(title, values, self)


FRONTIER_MIN = 1e-6
"""Coefficients and exponents at or below this count as zero (fitted to the bound)."""


def fit_chinchilla(
    N: ArrayLike, D: ArrayLike, L: ArrayLike, n_bootstrap: int = 200, seed: int = 0
) -> ChinchillaFit:
    """Chinchilla approach 3 on (N, D, L) points: >= 5 points from >= 3 sizes (several D per N help)."""
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
    fit = _fit(prob, n_bootstrap, seed)
    e, a, alpha, b, beta = fit.theta
    s = fit.samples
    std, ci = _uncertainty(
        {
            "E": np.exp(s[:, 0]),
            "A": np.exp(s[:, 1]),
            "B": np.exp(s[:, 3]),
            "alpha": s[:, 2],
            "beta": s[:, 4],
        }
    )
    return ChinchillaFit(
        math.exp(e),
        math.exp(a),
        math.exp(b),
        float(alpha),
        float(beta),
        n.size,
        fit.objective,
        std,
        ci,
        n_bootstrap,
    )
