"""Bootstrap resampling shared by every fit: residual resamples and percentile intervals.

Resampling *points* with replacement breaks a ladder's analysis: duplicates carry no new token
count, so a size's curve loses its ends, isoFLOP budgets lose their third size, and a 3-parameter
law is refitted to two distinct points. Instead every resample keeps the design (each N, D) and
redraws the noise: the fitted L(N, D) times resampled multiplicative residuals. Residuals come in
two layers, since runs share their seed: a per-size offset (the size's mean residual, resampled
across sizes) and the within-size scatter (resampled across all points).
"""

from __future__ import annotations

import math

import numpy as np

CI_LEVEL = 0.95


def residual_resamples(
    log_loss: np.ndarray,
    log_fitted: np.ndarray,
    groups: np.ndarray,
    n_params: int,
    n_resamples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """(n_resamples, n) log losses: fitted + a resampled size offset + resampled scatter.

    Residuals are inflated by sqrt(n / (n - n_params)): a fit's residuals are smaller than the
    noise that produced them by the degrees of freedom the fit used up.
    """
    resid = log_loss - log_fitted
    n = resid.size
    resid = resid * math.sqrt(n / max(n - n_params, 1))
    labels, index = np.unique(groups, return_inverse=True)
    offsets = np.array([resid[index == i].mean() for i in range(labels.size)])
    scatter = resid - offsets[index]
    drawn_offsets = offsets[rng.integers(0, labels.size, size=(n_resamples, labels.size))]
    drawn_scatter = scatter[rng.integers(0, n, size=(n_resamples, n))]
    return log_fitted + drawn_offsets[:, index] + drawn_scatter


def percentile_interval(values: np.ndarray) -> tuple[float, float]:
    """The central CI_LEVEL interval of the finite values; NaNs when fewer than 2 are finite."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size < 2:
        return math.nan, math.nan
    tail = 100 * (1 - CI_LEVEL) / 2
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return float(lo), float(hi)
