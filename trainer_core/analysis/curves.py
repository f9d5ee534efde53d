"""Each size's annealed loss as a curve over compute: what the frontier and isoFLOPs read.

A size's annealed points (one per WSD-S decay) are joined by straight lines in log L vs log C,
so a size's loss can be read at any budget inside its own range, and never outside it: a size
says nothing about compute it was not trained to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainer_core.analysis.errors import AnalysisError

BUDGETS_PER_DECADE = 12
"""Compute budgets per factor 10 of C at which the frontier and the isoFLOPs are read."""


@dataclass
class SizeCurve:
    size: str
    N: float
    log_c: np.ndarray  # ascending, distinct
    log_loss: np.ndarray

    def covers(self, log_c: float) -> bool:
        return bool(self.log_c[0] <= log_c <= self.log_c[-1])

    def loss(self, log_c: float) -> float:
        """Loss at a budget inside the size's range (interpolated in log-log)."""
        return float(np.exp(np.interp(log_c, self.log_c, self.log_loss)))


def size_curves(points: pd.DataFrame, loss: np.ndarray | None = None) -> list[SizeCurve]:
    """One curve per size, smallest N first; ``loss`` replaces ``points.eval_loss`` (resamples).

    Points at the same compute within a size are averaged.
    """
    values = points["eval_loss"].to_numpy(float) if loss is None else np.asarray(loss, float)
    frame = pd.DataFrame(
        {
            "size": points["size"].to_numpy(),
            "N": points["N"].to_numpy(float),
            "log_c": np.log(points["flops"].to_numpy(float)),
            "log_loss": np.log(values),
        }
    )
    curves = []
    for size, g in frame.groupby("size", sort=False):
        g = g.groupby("log_c", as_index=False)["log_loss"].mean()
        curves.append(
            SizeCurve(
                str(size),
                float(frame.loc[frame["size"] == size, "N"].iloc[0]),
                g["log_c"].to_numpy(),
                g["log_loss"].to_numpy(),
            )
        )
    return sorted(curves, key=lambda c: c.N)


def budget_grid(curves: list[SizeCurve], min_sizes: int, what: str) -> np.ndarray:
    """Log budgets, BUDGETS_PER_DECADE a decade, over the compute that >= ``min_sizes`` cover.

    The grid is anchored at multiples of the step so that a resample of the same ladder reads
    the same budgets.
    """
    step = np.log(10) / BUDGETS_PER_DECADE
    lo = min(c.log_c[0] for c in curves)
    hi = max(c.log_c[-1] for c in curves)
    grid = np.arange(np.ceil(lo / step), np.floor(hi / step) + 1) * step
    if min_sizes == 1:
        # a size with one annealed point (a cosine run's end) covers no budget of the grid
        grid = np.union1d(grid, [c.log_c[0] for c in curves if c.log_c.size == 1])
    covered = [x for x in grid if sum(c.covers(x) for c in curves) >= min_sizes]
    if not covered:
        if all(c.log_c.size == 1 for c in curves):
            raise AnalysisError(
                f"{what}: each size has one annealed point, so no compute budget is read off "
                f"{min_sizes} sizes; give each size several (duration.decay_points, WSD-S)"
            )
        ranges = ", ".join(
            f"{c.size} {np.exp(c.log_c[0]):.3g}..{np.exp(c.log_c[-1]):.3g}" for c in curves
        )
        raise AnalysisError(
            f"{what}: no compute budget is covered by {min_sizes} sizes (annealed FLOPs per size: "
            f"{ranges}); train the smaller sizes longer so their ranges overlap"
        )
    return np.array(covered)
