"""A sweep experiment as the hyperparameter laws read it: one row per annealed eval of each
trial, with its run's name, N, D (tokens at that eval), peak LR, global batch (tokens) and loss.

Kept apart from the fits (:mod:`trainer_core.analysis.hparam_laws`), which take any such table:
a published sweep read from CSV as well as one of ours.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainer_core.analysis.load import ExperimentResults
from trainer_core.analysis.optimum import ENDED_WORSE

HORIZON_TOLERANCE = 0.05
"""Annealed points of one size within 5% in tokens are one horizon: a WSD-S decay ends on a whole
step, so trials with different batches reach the same horizon at slightly different tokens."""


class SweepCells:
    """A sweep's table (:func:`hparam_table`) and each hyperparameter's cell optima, fitted once:
    a ladder's ``lr.from_sweep`` and ``batch.from_sweep`` and the sweep's report read the same."""

    def __init__(self, results: ExperimentResults):
        self.results = results
        self.table = hparam_table(results)
        self._cells: dict[str, list] = {}

    def cells(self, param: str) -> list:
        """:func:`~trainer_core.analysis.hparam_laws.cell_optima` of ``param`` ("lr", "batch")."""
        from trainer_core.analysis.hparam_laws import cell_optima

        if param not in self._cells:
            self._cells[param] = cell_optima(self.table, param)
        return self._cells[param]


def hparam_table(results: ExperimentResults) -> pd.DataFrame:
    """An experiment's sweep table: one row per annealed eval of a trial.

    Annealed points only: each WSD-S decay gives a finished-schedule loss, so one trial fills a
    cell at each of its horizons; a point at peak LR (before a decay) answers no horizon. A
    trial stopped early or diverged (:data:`~trainer_core.analysis.optimum.ENDED_WORSE`)
    counts at the decays it finished, as those losses are final (a diverged run's record ends
    before its first non-finite step), and at its group's later horizons with an infinite loss:
    it is worse than the trials that went on, so it brackets those cells' optima (as in the
    sweep report's, lr.py).
    """
    runs = results.runs.set_index("name")
    points = results.points
    pts = points[points["annealed"].astype(bool) & points["name"].isin(runs.index)]
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
    return pd.concat([table, _ended_before(runs, table)], ignore_index=True)


def _ended_before(runs: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Rows of infinite loss for each trial that ended worse (stopped early or diverged) at the
    horizons its group's other trials reached past its last annealed point (group: a size and
    run length)."""
    groups = run_groups(runs)
    horizons = table.assign(group=table["name"].map(groups)).groupby("group")["D"].unique()
    rows = []
    for name in runs.index[runs["status"].isin(ENDED_WORSE)]:
        reached = table.loc[table["name"] == name, "D"].max()  # NaN: before any decay
        run = runs.loc[name]
        rows += [
            {
                "name": name,
                "N": run["num_params"],
                "D": d,
                "lr": run["peak_lr"],
                "batch": run["global_batch_tokens"],
                "loss": np.inf,
            }
            for d in horizons.get(groups[name], [])
            if not d <= reached * (1 + HORIZON_TOLERANCE)
        ]
    return pd.DataFrame(rows, columns=table.columns).astype(table.dtypes)


def run_groups(runs: pd.DataFrame) -> pd.Series:
    """Each run's early-stopping group (a size and run length: its ``group`` tag), else its
    size; ``runs`` indexed by name. One definition for the sweep report and the laws' cells."""
    return runs.get("tag_group", runs["size"]).fillna(runs["size"])


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
