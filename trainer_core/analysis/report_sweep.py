"""The LR-sweep half of the report: every trial, the optimum per size and LR*(N), and what a
ladder fed from the sweep plans with: the (N, D) cells' optima and the LR* / B* laws through
them, found by the ladder's own calls (:mod:`trainer_core.ladder.lr_feedback`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from trainer_core.analysis.hparam_laws import CellOptimum
from trainer_core.analysis.hparam_table import SweepCells
from trainer_core.analysis.lr import (
    COMPARED,
    batches_differ,
    fit_sweep_lr,
    lr_sweep_table,
    optimal_lrs,
)
from trainer_core.analysis.plots import grid_centres, plot_lr_sweep, plot_lr_vs_size
from trainer_core.analysis.plots_hparams import plot_hparam_laws
from trainer_core.analysis.report_data import Report, fmt_loss
from trainer_core.analysis.target import SweepLaws, sweep_laws
from trainer_core.ladder.lr_feedback import BATCH_KEY, LR_KEY, ONE_HORIZON, horizons_swept


def _status(row) -> str:
    if row.diverged:
        return f"diverged at {row.diverged_step}"
    if row.stopped_early:
        return f"stopped at step {row.steps_run}"
    return row.status


def _compared(row) -> str:
    """The loss the optima compare; a trial that ended on its loss's account is worse than
    every one that went on, with no loss of its own there."""
    if row.diverged:
        return "worse (diverged)"
    loss = getattr(row, COMPARED)
    return "worse (stopped)" if loss == np.inf else fmt_loss(loss)


def _trials(table: pd.DataFrame) -> Table:
    """Every trial, with its batch where a size tried several (else rows of one LR at two
    batches would read as duplicates)."""
    batches = batches_differ(table)
    shown = Table(
        title="LR sweep: trials compared at the last eval every finished trial reached"
        + (" (in tokens: the batches differ)" if batches else "")
        + "; one stopped before it or diverged counts as worse"
    )
    cols = ["size", "lr", *(["batch (tokens)"] if batches else []), "compared at", "loss there"]
    for col in (*cols, "final eval", "steps", "status"):
        shown.add_column(col, justify="left" if col in ("size", "status") else "right")
    for row in table.itertuples(index=False):
        shown.add_row(
            row.size,
            f"{row.lr:.3e}",
            *([f"{row.batch:,}"] if batches else []),
            "-" if pd.isna(row.compared_step) else f"step {row.compared_step}",
            _compared(row),
            fmt_loss(row.final_eval_loss),
            f"{row.steps_run}/{row.total_steps}",
            _status(row),
        )
    return shown


def sweep_section(report: Report, console: Console) -> None:
    table = lr_sweep_table(report.results)
    console.print(_trials(table))
    order = table.groupby("size")["N"].first().sort_values()
    report.optima = optimal_lrs(table)
    for size in order.index:
        if size in report.optima:
            console.print(f"{size}: {report.optima[size]}")
        else:
            report.skipped.append(f"optimal LR of {size}: no trial evaluated without diverging")
    report.lr_law = report.attempt(
        "lr*(N)", lambda: fit_sweep_lr(report.results, optima=report.optima)
    )
    if report.lr_law is not None:
        console.print(str(report.lr_law))
        if note := report.lr_law.left_out_note:
            report.skipped.append(note)
    report.plots.append(plot_lr_sweep(table, report.optima, report.out_dir / "lr_sweep.png"))
    if len(report.optima) >= 2:
        report.plots.append(_lr_vs_size(report, order))
    report.attempt("the laws a ladder plans with", lambda: _ladder_laws(report, console))


def _lr_vs_size(report: Report, n_of: pd.Series) -> Path:
    """Every size's optimum against N with the fitted LR*(N) and the LRs the grid was centred
    on: those it left out drawn as bounds."""
    optima = list(report.optima.values())
    centres = grid_centres(report.results.runs)
    return plot_lr_vs_size(
        [n_of[size] for size in report.optima],
        [o.lr for o in optima],
        report.lr_law,
        report.out_dir / "lr_vs_size.png",
        ([o.lr_low for o in optima], [o.lr_high for o in optima]),
        [o.at_edge for o in optima],
        [centres.get(size, math.nan) for size in report.optima],
    )


def _ladder_laws(report: Report, console: Console) -> None:
    """What a ladder fed from this sweep plans with (:func:`sweep_laws`, as the target table
    reads them): the (N, D) cells' optima, then the LR law ``lr.from_sweep`` uses (LR*(N, D), or
    LR*(N) with why) and, the batch swept, the B* law ``batch.from_sweep`` uses with its
    ``batch.sweep_law``, each with its flags, or the one line that stops the plan; the laws'
    figures beside the others."""
    sweep = SweepCells(report.results)
    laws = sweep_laws(sweep, lr_of_n=report.lr_law)
    console.print(f"What a ladder fed from this sweep plans with ({LR_KEY}, {BATCH_KEY}):")
    swept = horizons_swept(sweep.table)
    if swept >= 2:  # else its cells are the per-size optima above
        _print_cells(console, "LR", sweep.cells("lr"))
    _print_lr_law(console, laws, swept)
    if sweep.cells("batch"):
        _print_cells(console, "batch", sweep.cells("batch"))
        _print_batch_law(console, laws)
    cells = {"lr": sweep.cells("lr"), "batch": sweep.cells("batch")}
    rules = laws.rules
    report.plots += plot_hparam_laws(
        sweep.table, rules.lr_law, rules.batch_law, Path(report.out_dir), cells
    )


def _print_cells(console: Console, what: str, cells: list[CellOptimum]) -> None:
    if not cells:
        console.print(f"{what} optimum per (N, D) cell: none (no annealed eval varies the {what})")
        return
    console.print(f"{what} optimum per (N, D) cell:")
    for cell in cells:
        console.print(f"  {cell}")


def _print_lr_law(console: Console, laws: SweepLaws, swept: int) -> None:
    """The LR law ``lr.from_sweep`` plans with, its refusal, or the LR*(N) of a sweep of
    ``swept`` < 2 horizons a size and why."""
    if "lr" in laws.refused:
        console.print(laws.refusal("lr"), style="yellow")
        return
    if laws.rules.lr_law is not None:
        console.print(f"{LR_KEY}: each size at its run's final D: {laws.rules.lr_law}")
        return
    seen = "no annealed eval (a decay's end)" if swept == 0 else "annealed evals at one D per size"
    console.print(f"{LR_KEY}: {laws.rules.lr_of_n} ({ONE_HORIZON})")
    console.print(
        f"  falls back to LR*(N): the sweep has {seen}, and LR*(N, D) needs two horizons of a "
        "size to tell D's effect from N's (sweep.horizons)"
    )


def _print_batch_law(console: Console, laws: SweepLaws) -> None:
    """The B* law ``batch.from_sweep`` plans with and its ``batch.sweep_law``, or its refusal."""
    if "batch" in laws.refused:
        console.print(laws.refusal("batch"), style="yellow")
    else:
        console.print(f"{BATCH_KEY} (batch.sweep_law: {laws.batch_law}): {laws.rules.batch_law}")
