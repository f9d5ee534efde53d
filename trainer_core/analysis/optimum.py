"""The optimum of one loss curve over a log grid (an LR or batch sweep at one size and horizon).

One estimator for the sweep report's per-size LR* and the hyperparameter laws' cells, so both
read a sweep alike: a parabola in log value through the grid minimum and the points near it,
its interval from refits under the sweep's loss noise.

Near it means within a factor :data:`WINDOW_FACTOR` of the minimum, and never fewer than its
two neighbours. A window counted in points is as wide as the grid is coarse: two points a side
of a factor-4 grid span 256x, and the steep wall of a too-small LR then pulls the vertex a grid
step off (on a tiny-model sweep: 1.5e-2 where the best trials were 3e-3..9e-3, its loss 0.1
below every measured point). A parabola over the whole curve is worse still (the divergence
wall: 40% low on an asymmetric test curve).

A point of infinite loss is a value tried and judged worse without a loss at this horizon (a
trial that ended before it, :data:`ENDED_WORSE`): it brackets the optimum but is never fitted.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import numpy as np

from trainer_core.analysis.bootstrap import percentile_interval

N_BOOTSTRAP = 1000
"""Refits of a sweep's fits (a vertex under the loss noise, a law about its cells): cheap."""
WINDOW_FACTOR = 2.0
"""The parabola takes the grid minimum's neighbours and every point within this factor of it."""
REACH = math.log(WINDOW_FACTOR) * (1 + 1e-6)
"""In log units, with room for grids whose factor is WINDOW_FACTOR up to rounding."""
NOISE_HALF_WINDOW = 2
ENDED_WORSE = ("stopped", "diverged")
"""Run statuses of a trial that ended on its loss's account: early stopping judged it worse, or
its loss diverged. At a horizon it did not reach with a loss, either counts as worse than every
trial that did (+inf), so a diverged LR above the best brackets the optimum as a stopped one
does, in the sweep report's per-size LR* and in the laws' cells alike."""


def not_bracketed(what: str, low: float) -> str:
    """The flag a report line gives an optimum at its grid's edge (``low`` 0: the smallest
    value tried), one wording for the sweep report's per-size LR* and the laws' cells, so a
    reader sees the same optimum called the same thing in both."""
    side = "smallest" if low == 0 else "largest"
    return f"NOT BRACKETED: lowest loss at the grid's {side} {what}; widen it"


class GridOptimum(NamedTuple):
    value: float
    low: float
    high: float
    """The 95% interval: the vertices of refits under the loss noise, or, without a noise
    estimate or a usable vertex, the neighbouring grid values (0 or inf past an edge)."""
    loss: float
    method: Literal["quadratic", "grid"]
    at_edge: bool
    """The lowest loss is at the smallest or largest value tried: the optimum is a bound."""
    n_points: int


def window(x: np.ndarray, y: np.ndarray) -> slice:
    """The grid minimum, its neighbours and the further points within WINDOW_FACTOR of it,
    stopping at a point without a finite loss."""
    i = int(np.argmin(y))
    lo = hi = i
    while lo > 0 and np.isfinite(y[lo - 1]) and (lo == i or x[i] - x[lo - 1] <= REACH):
        lo -= 1
    while hi < len(x) - 1 and np.isfinite(y[hi + 1]) and (hi == i or x[hi + 1] - x[i] <= REACH):
        hi += 1
    return slice(lo, hi + 1)


def _design(x: np.ndarray) -> np.ndarray:
    return np.stack([x**2, x, np.ones_like(x)], axis=1)


def _vertices(x: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """The minimum over [x[0], x[-1]] of the parabola fitted to each row of Y: the vertex when
    convex and inside, else the lower end."""
    coef = Y @ np.linalg.pinv(_design(x)).T
    c2, c1 = coef[:, 0], coef[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = -c1 / (2 * c2)
    ends = _design(np.array([x[0], x[-1]])) @ coef.T
    lower_end = np.where(ends[0] <= ends[1], x[0], x[-1])
    return np.where(c2 > 0, np.clip(vertex, x[0], x[-1]), lower_end)


def _noise_window(y: np.ndarray) -> slice:
    """The grid minimum and up to NOISE_HALF_WINDOW finite points on each side."""
    i = int(np.argmin(y))
    lo = hi = i
    while lo > 0 and i - lo < NOISE_HALF_WINDOW and np.isfinite(y[lo - 1]):
        lo -= 1
    while hi < len(y) - 1 and hi - i < NOISE_HALF_WINDOW and np.isfinite(y[hi + 1]):
        hi += 1
    return slice(lo, hi + 1)


def pooled_noise(curves: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The loss noise, pooled over the curves ((x, y) pairs), from parabolas through up to five
    points around each minimum: the vertex's window often has no spare point, and a sweep's
    trials share their noise. On a coarse grid the curve's asymmetry counts as noise too: wider
    intervals, not narrower. NaN when no curve has more than three points there."""
    rss, dof = 0.0, 0
    for x, y in curves:
        w = _noise_window(y)
        xs, ys = x[w], y[w]
        if len(xs) > 3:
            coef, *_ = np.linalg.lstsq(_design(xs), ys, rcond=None)
            rss += float(np.sum((ys - _design(xs) @ coef) ** 2))
            dof += len(xs) - 3
    return math.sqrt(rss / dof) if dof else math.nan


def grid_optimum(
    x: np.ndarray, y: np.ndarray, noise: float, n_bootstrap: int, rng: np.random.Generator
) -> GridOptimum:
    """The optimum of the curve y(x), x the log values ascending (each once), y the lowest loss
    at each (inf: tried, judged worse); returned in values, not logs."""
    i = int(np.argmin(y))
    last = len(x) - 1
    if i in (0, last):
        low = 0.0 if i == 0 else math.exp(x[i - 1])
        high = math.exp(x[1]) if i == 0 and last > 0 else math.inf
        return GridOptimum(math.exp(x[i]), low, high, float(y[i]), "grid", True, len(x))
    neighbours = math.exp(x[i - 1]), math.exp(x[i + 1])
    w = window(x, y)
    xs, ys = x[w], y[w]
    coef = np.linalg.lstsq(_design(xs), ys, rcond=None)[0] if len(xs) >= 3 else None
    vertex = -coef[1] / (2 * coef[0]) if coef is not None and coef[0] > 0 else math.nan
    if not xs[0] <= vertex <= xs[-1]:
        return GridOptimum(math.exp(x[i]), *neighbours, float(y[i]), "grid", False, len(x))
    if math.isfinite(noise) and n_bootstrap > 0:
        fitted = _design(xs) @ coef
        draws = _vertices(xs, fitted + noise * rng.standard_normal((n_bootstrap, len(xs))))
        low, high = (math.exp(v) for v in percentile_interval(draws))
    else:
        low, high = neighbours
    loss = float(_design(np.array([vertex]))[0] @ coef)
    return GridOptimum(math.exp(vertex), low, high, loss, "quadratic", False, len(x))
