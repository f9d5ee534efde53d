"""The one fitter behind every scaling law here: a sum of exponentials in log space.

log L = logsumexp(theta . x_k) covers both L(C) = E + A C^-alpha and L(N, D) = E + A/N^a + B/D^b.
Huber loss (delta 1e-3) on log L_pred - log L, summed over points (Hoffmann et al. 2022, approach
3); a vectorised pass over a grid of initial values, then L-BFGS-B from the best grid points.
Bootstrap resamples are refitted from their own best grid points: starting every resample at the
full-data optimum would pull the resamples towards it and shrink the intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy.optimize import minimize

from trainer_core.analysis.bootstrap import (
    fits_every_point,
    parallel_map,
    percentile_interval,
    residual_resamples,
)

HUBER_DELTA = 1e-3
LOCAL_STARTS = 16
"""L-BFGS-B runs per fit: from the best-scoring points of the initial-value grid."""
BOOTSTRAP_STARTS = 2
"""L-BFGS-B runs per bootstrap resample, from that resample's best grid points."""


@dataclass
class Problem:
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
    def build(cls, log_x: list[np.ndarray], log_loss: np.ndarray, grid: np.ndarray) -> Problem:
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

    def with_log_loss(self, log_loss: np.ndarray) -> Problem:
        return Problem(self.terms, log_loss, self.grid, self.centres)


def huber(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    small = np.abs(r) <= HUBER_DELTA
    value = np.where(small, 0.5 * r**2, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA))
    return value, np.where(small, r, HUBER_DELTA * np.sign(r))


def objective(theta: np.ndarray, prob: Problem) -> tuple[float, np.ndarray]:
    z = prob.terms @ theta  # (K, n)
    zmax = z.max(axis=0)
    w = np.exp(z - zmax)
    total = w.sum(axis=0)
    resid = zmax + np.log(total) - prob.log_loss
    value, dvalue = huber(resid)
    weights = w / total  # d log L_pred / d z_k
    grad = np.einsum("kn,knp->p", weights * dvalue, prob.terms)
    # Scaled by 1/delta^2 (same minimiser) so L-BFGS-B's relative tolerances see O(1) values.
    return float(value.sum()) / HUBER_DELTA**2, grad / HUBER_DELTA**2


def grid_scores(prob: Problem) -> np.ndarray:
    z = np.einsum("knp,gp->gkn", prob.terms, prob.grid)
    zmax = z.max(axis=1)
    log_pred = zmax + np.log(np.exp(z - zmax[:, None, :]).sum(axis=1))
    return huber(log_pred - prob.log_loss)[0].sum(axis=1)


def solve(prob: Problem, starts: np.ndarray) -> tuple[np.ndarray, float]:
    """The best L-BFGS-B optimum over ``starts``; the first wins ties, however many cores ran them."""
    results = parallel_map(partial(descend, prob), starts)
    best, best_value = starts[0], math.inf
    for x, value in results:
        if value < best_value:
            best, best_value = x, value
    return best, best_value * HUBER_DELTA**2


def descend(prob: Problem, x0: np.ndarray) -> tuple[np.ndarray, float]:
    # Exponents (every other parameter from index 2) stay >= 0.
    bounds = [(0.0, 10.0) if i and i % 2 == 0 else (None, None) for i in range(prob.grid.shape[1])]
    res = minimize(
        objective,
        x0,
        args=(prob,),
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": 2000, "ftol": 1e-12, "gtol": 1e-8},
    )
    return res.x, float(res.fun)


def best_grid_points(prob: Problem, k: int) -> np.ndarray:
    return prob.grid[np.argsort(grid_scores(prob))[:k]]


@dataclass
class FitResult:
    """Raw parameters (e, c_1, p_1, ...), the summed Huber loss and the bootstrap refits."""

    theta: np.ndarray
    objective: float
    samples: np.ndarray  # (n_bootstrap, P), empty without a bootstrap


def fit_problem(
    prob: Problem, n_bootstrap: int, seed: int, groups: np.ndarray | None, group_params: int
) -> FitResult:
    """The fit and its bootstrap refits; ``group_params``: parameters that vary between groups.
    No refits for a law through every point (:func:`fits_every_point`)."""
    theta, value = solve(prob, best_grid_points(prob, LOCAL_STARTS))
    n = prob.log_loss.size
    if fits_every_point(n, theta.size):
        n_bootstrap = 0
    resamples = residual_resamples(
        prob.log_loss,
        prob.log_pred(theta),
        np.arange(n) if groups is None else groups,
        theta.size,
        n_bootstrap,
        np.random.default_rng(seed),
        theta.size if groups is None else group_params,
    )
    samples = parallel_map(partial(refit, prob), resamples)
    samples_raw = prob.to_raw(np.array(samples).reshape(len(samples), theta.size))
    return FitResult(prob.to_raw(theta), value, samples_raw)


def refit(prob: Problem, log_loss: np.ndarray) -> np.ndarray:
    """Centred parameters of one bootstrap resample, from its own best grid points."""
    sub = prob.with_log_loss(log_loss)
    return solve(sub, best_grid_points(sub, BOOTSTRAP_STARTS))[0]


def uncertainty(
    samples: dict[str, np.ndarray],
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Std and percentile CI of each parameter's bootstrap values (NaN without a bootstrap)."""
    std = {
        name: float(np.std(v, ddof=1)) if len(v) >= 2 else math.nan for name, v in samples.items()
    }
    return std, {name: percentile_interval(v) for name, v in samples.items()}
