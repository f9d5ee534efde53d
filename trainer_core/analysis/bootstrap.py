"""Bootstrap resampling shared by every fit: residual resamples and percentile intervals.

Resampling *points* with replacement breaks a ladder's analysis: duplicates carry no new token
count, so a size's curve loses its ends, isoFLOP budgets lose their third size, and a 3-parameter
law is refitted to two distinct points. Instead every resample keeps the design (each N, D) and
redraws the noise: the fitted L(N, D) times resampled multiplicative residuals. Residuals come in
two layers, since runs share their seed: a per-size offset (the size's mean residual, resampled
across sizes) and the within-size scatter (resampled across all points).

The refits are independent and dominate a ladder's analysis (hundreds of L-BFGS-B fits), so
:func:`parallel_map` spreads them over the machine's cores; the result does not depend on how many.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable
from statistics import NormalDist
from typing import TypeVar

import numpy as np
from joblib import Parallel, delayed

from trainer_core.analysis.errors import AnalysisError

CI_LEVEL = 0.95
Z_CI = NormalDist().inv_cdf(0.5 + CI_LEVEL / 2)
"""Standard normal quantile of the CI_LEVEL interval's upper end (1.96)."""
MIN_PARALLEL_ROWS = 8
"""Fewer rows than this run in-process: the pool's start-up (~1 s, once per process) costs more."""
MAX_FIT_WORKERS = 8
WORKERS_ENV = "RAYLADDER_ANALYSIS_WORKERS"
"""Processes the refits may use (default: the cores this process may run on, at most
:data:`MAX_FIT_WORKERS`); 1 keeps them in-process, for a machine whose cores are busy already."""

T = TypeVar("T")
_in_worker = False


def fits_every_point(n_points: int, n_params: int) -> bool:
    """Whether a law of ``n_params`` parameters passes through all ``n_points``: its residuals
    are then zero, so every resample repeats the fit (intervals of zero width) and none is drawn."""
    return n_points <= n_params


def no_noise_to_redraw(n_points: int, n_params: int, law: str = "the law") -> str:
    """Why a fit resampled around a law that :func:`fits_every_point` has no intervals, and the
    fix: the one line every fit and the report give for it."""
    return (
        f"{n_points} points for {n_params} parameters: {law} passes through every one, so "
        f"there is no noise to redraw: no {100 * CI_LEVEL:.0f}% intervals (give each size more "
        "annealed points, e.g. WSD-S decays, or add sizes)"
    )


def residual_resamples(
    log_loss: np.ndarray,
    log_fitted: np.ndarray,
    groups: np.ndarray,
    n_params: int,
    n_resamples: int,
    rng: np.random.Generator,
    group_params: int | None = None,
) -> np.ndarray:
    """(n_resamples, n) log losses: fitted + a resampled size offset + resampled scatter.

    A fit's residuals are smaller than the noise that produced them by the degrees of freedom it
    used up, so each layer is inflated by its own: the k size offsets by sqrt(k / (k - g)), where
    ``group_params`` g of the ``n_params`` vary between sizes (E, A, alpha of L(N, D): with 4
    sizes they absorb 3 of the 4 offsets), the scatter by the rest. Default g: all of them (every
    point its own group, one layer). With one point per size there is no scatter layer, so
    all ``n_params`` came out of the offsets.
    """
    if n_resamples < 0:
        raise AnalysisError(f"n_bootstrap = {n_resamples}: must be >= 0 (0: no intervals)")
    resid = log_loss - log_fitted
    n = resid.size
    labels, index = np.unique(groups, return_inverse=True)
    k = labels.size
    g = n_params if group_params is None or n == k else group_params
    offsets = np.array([resid[index == i].mean() for i in range(k)])
    scatter = resid - offsets[index]
    # Centred: a robust (Huber) fit leaves the offsets' mean off zero, and drawing them as they
    # are would shift every resample by it, and the intervals with it.
    offsets = (offsets - offsets.mean()) * math.sqrt(k / max(k - g, 1))
    if n > k:
        scatter = scatter * math.sqrt((n - k) / max(n - k - (n_params - g), 1))
    drawn_offsets = offsets[rng.integers(0, labels.size, size=(n_resamples, labels.size))]
    drawn_scatter = scatter[rng.integers(0, n, size=(n_resamples, n))]
    return log_fitted + drawn_offsets[:, index] + drawn_scatter


def centred_on_estimate(
    samples: np.ndarray, estimate: np.ndarray, at_smoother: np.ndarray
) -> np.ndarray:
    """Refits of resamples drawn around an L(N, D) smoother, moved to scatter around the
    estimate instead of around what the smoother implies.

    Approach 2 is resampled around approach 3's fit, so its refits spread around
    ``at_smoother`` (the same estimator on the smoother's noise-free predictions), not around
    its own ``estimate``: an interval taken as it is sits on approach 3's answer and hides a
    disagreement between the two. Shifted by ``estimate - at_smoother`` it is the estimate's own
    sampling spread. Sound for parameters a prediction is linear in (approach 2's line: the
    shift moves every predicted N_opt by the two lines' difference); a nonlinear law's
    predictions are moved otherwise (the frontier's: :meth:`PowerLawFit.predict_samples`), and
    an exponent bounded at zero by :func:`scaled_onto_estimate`. Unchanged where the smoother
    implies no value (NaN).
    """
    if not np.all(np.isfinite(at_smoother)):
        return samples
    return samples - at_smoother + estimate


def scaled_onto_estimate(samples: np.ndarray, estimate: float, at_smoother: float) -> np.ndarray:
    """:func:`centred_on_estimate` in log space, for a parameter the fitter bounds at zero (an
    exponent): refits times ``estimate / at_smoother``.

    Shifted, an exponent's refits drawn around a steeper law than the estimate go below zero
    (the demo's frontier: alpha 0.143, 95% CI -0.067 .. 0.369, a loss rising with compute that
    no refit had); scaled, they keep their sign and their relative spread. Unchanged where the
    smoother implies no positive value.
    """
    if not (math.isfinite(at_smoother) and at_smoother > 0):
        return samples
    return samples * (estimate / at_smoother)


def percentile_interval(values: np.ndarray) -> tuple[float, float]:
    """The central CI_LEVEL interval of the finite values; NaNs when fewer than 2 are finite."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size < 2:
        return math.nan, math.nan
    tail = 100 * (1 - CI_LEVEL) / 2
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return float(lo), float(hi)


def percentile_band(values: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`percentile_interval` of each point: ``values`` holds one row per refit, each of
    ``shape`` (a prediction's points); NaN arrays without refits."""
    refits = np.asarray(values, dtype=float).reshape(-1, *shape)
    refits = np.where(np.isfinite(refits), refits, np.nan)
    enough = np.count_nonzero(np.isfinite(refits), axis=0) >= 2
    lo, hi = np.full(shape, math.nan), np.full(shape, math.nan)
    if np.any(enough):
        tail = 100 * (1 - CI_LEVEL) / 2
        band = np.nanpercentile(refits[:, enough], [tail, 100 - tail], axis=0)
        lo[enough], hi[enough] = band
    return lo, hi


def prediction_interval(
    samples: np.ndarray, shape: tuple[int, ...]
) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
    """A law's prediction interval from its refits' predictions: floats at one point
    (``shape`` ()), arrays of ``shape`` at many."""
    if shape == ():
        return percentile_interval(samples)
    return percentile_band(samples, shape)


def parallel_map(fn: Callable[[np.ndarray], T], rows: np.ndarray) -> list[T]:
    """``fn(row)`` for every row of ``rows`` (resamples, or a fit's start points), in order,
    over the machine's cores when there are enough rows to pay for it.

    joblib's process workers start once per process and never re-import the caller's main script,
    so this is safe from a notebook, a script without a main guard, or a Ray driver with threads.
    ``fn`` must pickle (a module-level function or a ``functools.partial`` of one). Calls made
    inside a worker (a refit's own multi-start) and inside another process pool (the coverage
    benchmark's) stay in-process.
    """
    rows = np.asarray(rows)
    workers = fit_workers()
    nested = _in_worker or multiprocessing.parent_process() is not None
    if workers < 2 or nested or len(rows) < MIN_PARALLEL_ROWS:
        return [fn(r) for r in rows]
    chunks = [c for c in np.array_split(rows, min(len(rows), 4 * workers)) if len(c)]
    parts = Parallel(n_jobs=workers)(delayed(_map_chunk)(fn, c) for c in chunks)
    return [out for part in parts for out in part]


def _map_chunk(fn: Callable[[np.ndarray], T], chunk: np.ndarray) -> list[T]:
    global _in_worker
    _in_worker = True
    return [fn(r) for r in chunk]


def fit_workers() -> int:
    """How many processes :func:`parallel_map` spreads over (:data:`WORKERS_ENV`)."""
    given = os.environ.get(WORKERS_ENV, "").strip()
    if not given:
        return min(_cores(), MAX_FIT_WORKERS)
    if not given.isdigit() or int(given) < 1:
        raise AnalysisError(f"{WORKERS_ENV}={given!r}: give a whole number of processes, >= 1")
    return int(given)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
