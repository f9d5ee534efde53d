"""Widening a sweep's grid: which trials a sweep runs next when a best trial is at an edge.

A best LR (or batch) at the edge of the grid is a bound, not an optimum. The next round tries
one value beyond that edge, a grid step further out, until the optimum is interior. Trials are
judged as the optimum judges them (:func:`~trainer_core.analysis.lr.judged`): a diverged or
early-stopped trial is worse than every one with a loss, so a diverged LR above the best
brackets it, and the grid widens where the report says the optimum is not bracketed, and
into a gap of two or more grid steps between the best LR and such a trial.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from trainer_core.analysis.lr import COMPARED, judged, lr_curve

DEFAULT_STEP = 2.0
"""Factor between LRs when a size has only one usable LR to take the grid spacing from."""


def _tried(lr: float, tried: np.ndarray) -> bool:
    return bool(np.any(np.isclose(tried, lr, rtol=1e-6)))


def widen_lrs(table: pd.DataFrame, loss: str = COMPARED) -> dict[str, list[float]]:
    """Per size whose optimum is at its grid's edge (:func:`~trainer_core.analysis.lr.optimal_lr`'s
    ``at_edge``: the best LR the smallest or largest judged): the LR beyond, one grid step out.

    A size with no trial of finite loss (every one diverged, or none has an eval yet) gets the
    LR below its smallest. Sizes with an interior optimum get nothing.
    """
    out: dict[str, list[float]] = {}
    for size, rows in table.groupby("size", sort=False):
        tried = rows["lr"].to_numpy(float)
        new = [lr for lr in _lrs_beyond(rows, loss) if not _tried(lr, tried)]
        if new:
            out[str(size)] = new
    return out


def _lrs_beyond(rows: pd.DataFrame, loss: str) -> list[float]:
    """The LRs a grid step beyond the edge the best LR sits at (the step between the two LRs
    at that edge; :data:`DEFAULT_STEP` with one LR)."""
    x, y = lr_curve(rows, loss)
    if not np.isfinite(y).any():
        return [float(rows["lr"].min()) / DEFAULT_STEP]
    lrs = np.exp(x)
    if lrs.size == 1:
        return [float(lrs[0] / DEFAULT_STEP), float(lrs[0] * DEFAULT_STEP)]
    best = int(np.argmin(y))
    out = []
    if best == 0:
        out.append(float(lrs[0] ** 2 / lrs[1]))
    if best == lrs.size - 1:
        out.append(float(lrs[-1] ** 2 / lrs[-2]))
    return out + _into_gaps(lrs, y, best)


def _into_gaps(lrs: np.ndarray, y: np.ndarray, best: int) -> list[float]:
    """A grid step from the best LR towards a neighbour judged worse without a loss (diverged,
    or stopped early) two or more grid steps away. Such a neighbour bounds the optimum, but far
    off (a grid that ends in an LR meant to diverge) it leaves untried the LRs where the
    optimum may be; the step is the one between the best and its other neighbour."""
    out = []
    for side in (-1, 1):
        near, other = best + side, best - side
        if not (0 <= near < lrs.size) or np.isfinite(y[near]):
            continue
        step = lrs[best] / lrs[other] if 0 <= other < lrs.size else DEFAULT_STEP**side
        step = max(step, 1 / step)
        if abs(math.log(lrs[near] / lrs[best])) >= 2 * math.log(step) * (1 - 1e-9):
            out.append(float(lrs[best] * step**side))
    return out


def _batches_beyond(at_lr: pd.DataFrame, best: int) -> list[int]:
    """The batch a grid step beyond ``best`` when it is the smallest or largest tried at its
    LR (none when that LR tried one batch: a sweep that does not vary the batch)."""
    batches = np.sort(at_lr["batch"].unique().astype(float))
    if batches.size < 2:
        return []
    if best == batches[0]:
        return [round(best * batches[0] / batches[1])]
    if best == batches[-1]:
        return [round(best * batches[-1] / batches[-2])]
    return []


def widen_sweep(table: pd.DataFrame, loss: str = COMPARED) -> dict[str, list[tuple[float, int]]]:
    """Per early-stopping group (a size and run length) whose best trial is at an edge: the
    (LR, batch) trials beyond it; an LR beyond at the best trial's batch (:func:`widen_lrs`),
    a batch beyond at its LR. A group whose every trial diverged gets the LR below at each batch.

    The batch is a target: the plan rounds it to one the size's mesh holds.
    """
    out: dict[str, list[tuple[float, int]]] = {}
    for group, rows in table.groupby("group", sort=False):
        ok = judged(rows, loss)
        finite = bool(np.isfinite(ok[loss]).any())
        if finite:
            best = ok.loc[ok[loss].idxmin()]
            batches = [best["batch"]]
        else:
            batches = rows["batch"].unique()
        wanted = [
            (lr, int(b))
            for b in batches
            for lrs in widen_lrs(rows[rows["batch"] == b], loss).values()
            for lr in lrs
        ]
        if finite:
            at_lr = ok[np.isclose(ok["lr"].astype(float), best["lr"], rtol=1e-6)]
            wanted += [(float(best["lr"]), b) for b in _batches_beyond(at_lr, best["batch"])]
        if wanted:
            out[str(group)] = wanted
    return out


def widen_horizons(points: pd.DataFrame, table: pd.DataFrame) -> dict[str, list[tuple[float, int]]]:
    """Per early-stopping group: an LR beyond the grid's edge at each horizon (a WSD-S decay)
    whose best LR is the smallest or largest tried there, at that horizon's best batch.

    :func:`widen_sweep` judges the final horizon alone, but LR*(N, D) needs every (N, D) cell
    bracketed, and LR* moves with the horizon: a short horizon can want an LR above the grid
    that the final one does not. ``points``: the sweep's annealed points with their run's name
    (:func:`~trainer_core.analysis.hparam_table.hparam_table`); ``table``: its trials
    (:func:`~trainer_core.analysis.lr.lr_sweep_table`: groups, and the trials that diverged)."""
    group_of = table.set_index("name")["group"]
    pts = points.assign(group=points["name"].map(group_of)).dropna(subset=["group"])
    out: dict[str, list[tuple[float, int]]] = {}
    for (group, _), at_d in pts.groupby(["group", "D"]):
        batch = at_d.loc[at_d["loss"].idxmin(), "batch"]
        tried = at_d[at_d["batch"] == batch]
        trials = table[(table["group"] == group) & (table["batch"] == batch)]
        # A trial stopped or diverged before this horizon is in ``tried`` with an infinite loss,
        # one that diverged after it with its loss here; a diverged one the points lack is worse.
        lost = trials[trials["diverged"].astype(bool) & ~trials["name"].isin(tried["name"])]
        frame = pd.DataFrame(
            {
                "size": group,
                "lr": [*tried["lr"], *lost["lr"]],
                "diverged": [False] * len(tried) + [True] * len(lost),
                COMPARED: [*tried["loss"], *[math.nan] * len(lost)],
            }
        )
        for lrs in widen_lrs(frame).values():
            out.setdefault(group, []).extend((lr, int(batch)) for lr in lrs)
    return out
