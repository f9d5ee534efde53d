"""Widening a sweep's grid: which trials a sweep runs next when a best trial is at an edge.

A best LR (or batch) at the edge of the grid is a bound, not an optimum. The next round tries
one value beyond that edge, a grid step further out, until the optimum is interior. Upwards in
LR it stops below the smallest LR that diverged: the optimum is then the largest stable LR, and
the report says it is at the edge.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from trainer_core.analysis.lr import COMPARED

DEFAULT_STEP = 2.0
"""Factor between LRs when a size has only one usable LR to take the grid spacing from."""


def _tried(lr: float, tried: np.ndarray) -> bool:
    return bool(np.any(np.isclose(tried, lr, rtol=1e-6)))


def widen_lrs(table: pd.DataFrame, loss: str = COMPARED) -> dict[str, list[float]]:
    """Per size whose best (non-diverged) LR is the smallest or largest tried: the LR beyond.

    A size whose every trial diverged gets the LR below its smallest. Sizes with an interior
    optimum, or whose next LR up would reach a diverged one, get nothing.
    """
    out: dict[str, list[float]] = {}
    for size, rows in table.groupby("size", sort=False):
        tried = rows["lr"].to_numpy(float)
        diverged = rows["diverged"].astype(bool).to_numpy()
        ok = _usable(rows, loss)
        lrs = np.sort(ok["lr"].unique().astype(float))
        if lrs.size == 0:
            candidates = [tried.min() / DEFAULT_STEP]
        else:
            best = float(ok.loc[ok[loss].astype(float).idxmin(), "lr"])
            step_low = lrs[1] / lrs[0] if lrs.size > 1 else DEFAULT_STEP
            step_high = lrs[-1] / lrs[-2] if lrs.size > 1 else DEFAULT_STEP
            candidates = []
            if math.isclose(best, lrs[0]):
                candidates.append(lrs[0] / step_low)
            ceiling = tried[diverged].min() if diverged.any() else math.inf
            if math.isclose(best, lrs[-1]) and lrs[-1] * step_high < ceiling:
                candidates.append(lrs[-1] * step_high)
        new = [float(lr) for lr in candidates if not _tried(lr, tried)]
        if new:
            out[str(size)] = new
    return out


def _usable(rows: pd.DataFrame, loss: str) -> pd.DataFrame:
    """The trials that did not diverge and have a compared loss: inf for one early stopping
    ended before the others (tried, and judged worse: it brackets, as in the optimum)."""
    return rows[~rows["diverged"].astype(bool) & rows[loss].astype(float).notna()]


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
        ok = _usable(rows, loss)
        if ok.empty:
            batches = rows["batch"].unique()
        else:
            best = ok.loc[ok[loss].astype(float).idxmin()]
            batches = [best["batch"]]
        wanted = [
            (lr, int(b))
            for b in batches
            for lrs in widen_lrs(rows[rows["batch"] == b], loss).values()
            for lr in lrs
        ]
        if not ok.empty:
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
    (:func:`~trainer_core.analysis.lr.lr_sweep_table`: groups, and the divergence that caps a
    step up)."""
    group_of = table.set_index("name")["group"]
    pts = points.assign(group=points["name"].map(group_of)).dropna(subset=["group"])
    out: dict[str, list[tuple[float, int]]] = {}
    for (group, _), at_d in pts.groupby(["group", "D"]):
        batch = at_d.loc[at_d["loss"].idxmin(), "batch"]
        tried = at_d[at_d["batch"] == batch]
        trials = table[(table["group"] == group) & (table["batch"] == batch)]
        lost = trials[trials["diverged"].astype(bool)]
        # A trial stopped before this horizon is in ``tried`` with an infinite loss: worse.
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
