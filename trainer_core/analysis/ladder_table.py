"""Ladders from elsewhere: a CSV or parquet table of results, read into the points the fits take.

A team's past ladders, or published ones, come as one row per evaluation: the run, its N, its
tokens D (or its FLOPs, from which D = FLOPs / (6 N)), a loss column and task columns
(``<task>/bpb`` and one or more accuracies: ``<task>/acc``, ``<task>/acc_norm``,
``<task>/acc_pmi``; optionally ``<task>/examples``, how many examples were scored, and
``<task>/chance``, a random guess's accuracy). The result has the columns of
``ExperimentResults.fit_points()`` (size, name, N, tokens, flops, eval_loss) plus the task
columns, so every fit, flag and interval reads it as it reads a ladder run here: with
``<task>/examples`` the held-out check's accuracy intervals take in the measurement's binomial
noise, as a ladder run's do.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.labels import compact
from trainer_core.analysis.load import CHANCE_SUFFIX, analysis_flops

TASK_LOSS_SUFFIX = "/bpb"
TASK_ACC_SUFFIX = "/acc"
ACCURACIES = ("acc", "acc_norm", "acc_pmi")
"""The accuracies a task may be scored by (docs/tasks.md): raw, per byte, and calibrated."""
AUTO = "auto"
"""Step 2's accuracy by default: the first of :data:`AUTO_ORDER` that a task has."""
AUTO_ORDER = ("acc_pmi", "acc", "acc_norm")
"""Calibrated first (small models' raw scores mostly rank how typical a choice is), then raw."""
ACC_SUFFIXES = tuple("/" + a for a in ACCURACIES)
EXAMPLES_SUFFIX = "/examples"
"""Optional: how many examples an accuracy was scored on (its binomial noise in the check)."""


def read_ladder_table(path: str | Path, loss: str | None = "loss") -> pd.DataFrame:
    """The points of the table at ``path`` (.csv, .parquet): size, name, N, tokens, flops,
    eval_loss (from the column ``loss``; None: the table has none) and every task column.

    Errors name the file and the column, and the line (CSV) or row (parquet) of a bad value.
    """
    path = Path(path)
    table = _read(path)
    need = ["run", "N"] + ([loss] if loss else [])
    missing = [c for c in need if c not in table.columns]
    if "D" not in table.columns and "FLOPs" not in table.columns:
        missing.append("D (or FLOPs)")
    if missing:
        raise AnalysisError(
            f"{path}: missing column {', '.join(missing)} (has: {', '.join(map(str, table.columns))})"
        )
    n = _positive(table, "N", path)
    tokens = (
        _positive(table, "D", path)
        if "D" in table
        else _positive(table, "FLOPs", path) / analysis_flops(n, 1.0)
    )
    out = pd.DataFrame(
        {
            "size": [_size_label(v) for v in n],
            "name": table["run"].astype(str),
            "N": n,
            "tokens": tokens,
            "flops": analysis_flops(n, tokens),
        }
    )
    if loss:
        out["eval_loss"] = _positive(table, loss, path)
    for column in task_columns(table):
        values = _finite(table, column, path)
        _check(table, column, path, *_task_value_ok(column, values))
        out[column] = values
    return out.reset_index(drop=True)


def task_columns(table: pd.DataFrame) -> list[str]:
    """The columns a task's fits and checks read: its loss, accuracies, examples and chance."""
    suffixes = (TASK_LOSS_SUFFIX, *ACC_SUFFIXES, EXAMPLES_SUFFIX, CHANCE_SUFFIX)
    return [str(c) for c in table.columns if str(c).endswith(suffixes)]


def _task_value_ok(column: str, values: np.ndarray) -> tuple[np.ndarray, str]:
    """Which values of a task column are valid for it, and what a valid one is."""
    if column.endswith(ACC_SUFFIXES):
        return (values >= 0) & (values <= 1), "an accuracy in 0 .. 1"
    if column.endswith(CHANCE_SUFFIX):
        return (values > 0) & (values < 1), "a chance accuracy between 0 and 1"
    if column.endswith(EXAMPLES_SUFFIX):
        return (values >= 1) & (values == np.round(values)), "a whole number of examples >= 1"
    return values > 0, "a positive number"


def task_names(points: pd.DataFrame) -> list[str]:
    """Tasks with both a task-loss and an accuracy column, in table order."""
    cols = set(points.columns)
    names = [str(c)[: -len(TASK_LOSS_SUFFIX)] for c in points.columns]
    return [
        t
        for t, c in zip(names, points.columns, strict=True)
        if str(c).endswith(TASK_LOSS_SUFFIX) and any(t + s in cols for s in ACC_SUFFIXES)
    ]


def accuracy_metric(points: pd.DataFrame, task: str, wanted: str = AUTO) -> str:
    """The accuracy step 2 fits for ``task``: ``wanted``, or with ``auto`` the first of
    :data:`AUTO_ORDER` that has values."""
    if wanted not in (AUTO, *ACCURACIES):
        raise AnalysisError(
            f"task accuracy {wanted!r}: use {AUTO} or one of {', '.join(ACCURACIES)}"
        )
    have = [
        a for a in ACCURACIES if f"{task}/{a}" in points and points[f"{task}/{a}"].notna().any()
    ]
    found = [a for a in (AUTO_ORDER if wanted == AUTO else (wanted,)) if a in have]
    if not found:
        asked = "accuracy column" if wanted == AUTO else f"{task}/{wanted} values"
        raise AnalysisError(
            f"task {task!r} has no {asked} (it has: {', '.join(have) or 'no accuracy'})"
        )
    return found[0]


def _read(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise AnalysisError(f"{path}: no such file")
    if path.suffix == ".csv":
        return pd.read_csv(path)
    if path.suffix in (".parquet", ".pq"):
        return pd.read_parquet(path)
    raise AnalysisError(f"{path}: a ladder table is a .csv or .parquet file")


def _where(path: Path, row: int) -> str:
    """A row as the reader finds it: the CSV's line (the header is line 1), or the row index."""
    return f"line {row + 2}" if path.suffix == ".csv" else f"row {row}"


def _check(table: pd.DataFrame, column: str, path: Path, ok: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(~ok)
    if bad.size:
        row = int(bad[0])
        raise AnalysisError(
            f"{path} {_where(path, row)}: column {column} is {table[column].iloc[row]!r}, "
            f"not {what} ({bad.size} such rows)"
        )


def _finite(table: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    values = pd.to_numeric(table[column], errors="coerce").to_numpy(float)
    _check(table, column, path, np.isfinite(values), "a finite number")
    return values


def _positive(table: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    values = _finite(table, column, path)
    _check(table, column, path, values > 0, "a positive number")
    return values


def _size_label(n: float) -> str:
    """190354176 -> '190M': sizes are told apart by N, labelled as a ladder names them."""
    return compact(n) if math.isfinite(n) else str(n)
