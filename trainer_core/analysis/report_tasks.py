"""The task half of a ladder report: per-size task loss and accuracy, then the two-step task
prediction of the held-out (largest) size with its 95% interval beside what that size measured.

A ladder's evals are WSD-S annealed points, each standing for a finished run of its length, so
step 1 fits all of them (``fit_task``'s default, which fits a table of published checkpoints on
each run's last one only). A task that cannot be fitted is skipped alone, with its reason; one
not scored at some sizes is fitted on the others, with a flag naming them.
"""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table

from trainer_core.analysis.ladder_table import ACC_SUFFIXES, AUTO, TASK_LOSS_SUFFIX
from trainer_core.analysis.plots_tasks import plot_task_prediction
from trainer_core.analysis.report_data import Report
from trainer_core.analysis.tasks import final_points, task_holdout_check, task_rows


def task_section(report: Report, console: Console, n_bootstrap: int, accuracy: str = AUTO) -> None:
    """Print the task table and the held-out prediction (step 2 on ``accuracy``: see
    :func:`~trainer_core.analysis.ladder_table.accuracy_metric`); one two-panel PNG per task."""
    results = report.results
    if not results.task_names:
        return
    points = results.task_points()
    console.print(task_table(points, results.task_names))
    held = report.attempt(
        "held-out task prediction",
        lambda: task_holdout_check(
            points, results.task_chances(), n_bootstrap=n_bootstrap, accuracy=accuracy
        ),
    )
    if held is None:
        return
    report.task_holdout = held
    report.skipped.extend(f"held-out task prediction: {why}" for why in held.skipped)
    console.print(str(held))
    train = points[points["N"] < points["N"].max()]
    for task, law in held.laws.items():
        preds = [p for p in held.predictions if p.task == task]
        path = report.out_dir / f"task_{task}.png"
        fitted = task_rows(train, task, law.accuracy)[0]
        report.plots.append(plot_task_prediction(law, fitted, preds, path, law.final_only))


def task_table(points: pd.DataFrame, tasks: list[str]) -> Table:
    """Each run's last eval: its tokens, and per task the task loss and every accuracy it has."""
    table = Table(title="downstream tasks at each size's last annealed eval")
    for col in ("size", "N", "tokens"):
        table.add_column(col, justify="left" if col == "size" else "right")
    columns = [
        task + suffix
        for task in tasks
        for suffix in (TASK_LOSS_SUFFIX, *ACC_SUFFIXES)
        if task + suffix in points
    ]
    for column in columns:
        task, metric = column.rsplit("/", 1)
        table.add_column(f"{task}\n{metric}", justify="right")  # two lines: never cut short
    for _, values in final_points(points).iterrows():
        cells = [
            _number(values.get(c), ".4f" if c.endswith(TASK_LOSS_SUFFIX) else ".3f")
            for c in columns
        ]
        table.add_row(values["size"], f"{values['N']:,}", f"{values['tokens']:,}", *cells)
    return table


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None or pd.isna(value) else format(value, fmt)
