"""The LR-sweep half of the report: every trial, the optimum per size and LR*(N)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from trainer_core.analysis.lr import COMPARED, fit_lr_power_law, lr_sweep_table, optimal_lrs
from trainer_core.analysis.plots import plot_lr_sweep, plot_lr_vs_size
from trainer_core.analysis.report_data import Report, fmt_loss


def _status(row) -> str:
    if row.diverged:
        return f"diverged at {row.diverged_step}"
    if row.stopped_early:
        return f"stopped at step {row.steps_run}"
    return row.status


def _compared(loss: float) -> str:
    return "worse (stopped)" if loss == np.inf else fmt_loss(loss)


def sweep_section(report: Report, console: Console) -> None:
    table = lr_sweep_table(report.results)
    shown = Table(
        title="LR sweep: trials compared at the last eval every trial that early stopping let "
        "run reached; one stopped before it counts as worse"
    )
    for col in ("size", "lr", "compared at", "loss there", "final eval", "steps", "status"):
        shown.add_column(col, justify="left" if col in ("size", "status") else "right")
    for row in table.itertuples(index=False):
        shown.add_row(
            row.size,
            f"{row.lr:.3e}",
            "-" if pd.isna(row.compared_step) else f"step {row.compared_step}",
            _compared(getattr(row, COMPARED)),
            fmt_loss(row.final_eval_loss),
            f"{row.steps_run}/{row.total_steps}",
            _status(row),
        )
    console.print(shown)
    order = table.groupby("size")["N"].first().sort_values()
    report.optima = optimal_lrs(table)
    for size in order.index:
        if size in report.optima:
            console.print(f"{size}: {report.optima[size]}")
        else:
            report.skipped.append(f"optimal LR of {size}: no trial evaluated without diverging")
    sizes = list(report.optima)
    n = np.array([order[s] for s in sizes], dtype=float)
    lrs = np.array([report.optima[s].lr for s in sizes])
    bracketed = [not report.optima[s].at_edge for s in sizes]
    edge = [s for s, ok in zip(sizes, bracketed, strict=True) if not ok]
    if edge:
        report.skipped.append(
            f"LR*(N) leaves out {', '.join(edge)}: best LR at the grid's edge (widen the grid)"
        )
    report.lr_law = report.attempt(
        "LR*(N) fit", lambda: fit_lr_power_law(n[bracketed], lrs[bracketed])
    )
    if report.lr_law is not None:
        console.print(str(report.lr_law))
    report.plots.append(plot_lr_sweep(table, report.optima, report.out_dir / "lr_sweep.png"))
    if len(sizes) >= 2:
        bounded = [report.optima[s] for s in sizes]  # an edge optimum's interval is open
        err = (
            [np.nan if o.at_edge else o.lr_low for o in bounded],
            [np.nan if o.at_edge else o.lr_high for o in bounded],
        )
        report.plots.append(
            plot_lr_vs_size(n, lrs, report.lr_law, report.out_dir / "lr_vs_size.png", err)
        )
