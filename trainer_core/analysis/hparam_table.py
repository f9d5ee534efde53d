"""A sweep experiment as the hyperparameter laws read it: one row per annealed eval of each
trial, with its run's name, N, D (tokens at that eval), peak LR, global batch (tokens) and loss.

Kept apart from the fits (:mod:`trainer_core.analysis.hparam_laws`), which take any such table:
a published sweep read from CSV as well as one of ours.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainer_core.analysis.load import ExperimentResults

HORIZON_TOLERANCE = 0.05
"""Annealed points of one size within 5% in tokens are one horizon: a WSD-S decay ends on a whole
step, so trials with different batches reach the same horizon at slightly different tokens."""


def hparam_table(results: ExperimentResults) -> pd.DataFrame:
    """An experiment's sweep table: one row per annealed eval of a trial that did not diverge.

    Annealed points only: each WSD-S decay gives a finished-schedule loss, so one trial fills a
    cell at each of its horizons; a point at peak LR (before a decay) answers no horizon. A
    trial stopped early still counts at the decays it finished, as those losses are final.
    """
    runs = results.runs.set_index("name")
    ok = runs.index[runs["status"] != "diverged"]
    points = results.points
    pts = points[points["annealed"].astype(bool) & points["name"].isin(ok)]
    pts = pts.dropna(subset=["eval_loss"])
    table = pd.DataFrame(
        {
            "name": pts["name"],
            "N": pts["N"].astype(float),
            "D": pts["tokens"].astype(float),
            "lr": pts["peak_lr"].astype(float),
            "batch": pts["name"].map(runs["global_batch_tokens"]).astype(float),
            "loss": pts["eval_loss"].astype(float),
        }
    )
    table["D"] = _snapped_horizons(table)
    return table.reset_index(drop=True)


def _snapped_horizons(df: pd.DataFrame) -> pd.Series:
    """D with each size's runs of values within HORIZON_TOLERANCE replaced by their geometric mean."""
    snapped = df["D"].copy()
    for _, rows in df.groupby("N"):
        groups: list[list[float]] = []
        for d in np.sort(rows["D"].unique()):
            if groups and d <= groups[-1][0] * (1 + HORIZON_TOLERANCE):
                groups[-1].append(d)
            else:
                groups.append([d])
        mean = {d: float(np.exp(np.mean(np.log(g)))) for g in groups for d in g}
        snapped[rows.index] = rows["D"].map(mean)
    return snapped
