"""The experiment report: tables, fits with uncertainty, extrapolation check, predictions, PNGs.

``workflows/analyze.py`` prints it for any experiment dir; ``workflows/ladder.py`` and
``workflows/lr_sweep.py`` print it when their runs finish. A fit that the data can't support (too
few sizes or points) is skipped with the reason, never an error: a 2-size demo still gets a report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from trainer_core.analysis.fits import ChinchillaFit, PowerLawFit
from trainer_core.analysis.load import AnalysisError, ExperimentResults, load
from trainer_core.analysis.lr import (
    LRPowerLawFit,
    OptimalLR,
    fit_lr_power_law,
    lr_sweep_table,
    optimal_lrs,
)
from trainer_core.analysis.plots import (
    plot_loss_curves,
    plot_loss_vs_compute,
    plot_lr_sweep,
    plot_lr_vs_size,
)
from trainer_core.analysis.predict import (
    ExtrapolationCheck,
    LossPrediction,
    chinchilla_from_points,
    compute_law_from_points,
    extrapolation_check,
    predict_loss,
)


@dataclass
class Report:
    """What :func:`report_experiment` found; ``None`` fits were skipped (reason in ``skipped``)."""

    results: ExperimentResults
    out_dir: Path
    plots: list[Path] = field(default_factory=list)
    chinchilla: ChinchillaFit | None = None
    compute_law: PowerLawFit | None = None
    extrapolation: ExtrapolationCheck | None = None
    predictions: list[LossPrediction] = field(default_factory=list)
    optima: dict[str, OptimalLR] = field(default_factory=dict)
    lr_law: LRPowerLawFit | None = None
    skipped: list[str] = field(default_factory=list)


def report_experiment(
    exp_dir: str | Path,
    out: str | Path | None = None,
    target_params: float | None = None,
    target_flops: float | None = None,
    n_bootstrap: int = 200,
    console: Console | None = None,
) -> Report:
    """Load ``exp_dir``, print the analysis and write PNGs to ``out`` (default ``<exp_dir>/analysis``)."""
    # No markup: run names and paths may contain [brackets]; long lines stay whole for grep.
    console = console or Console(width=120, markup=False, soft_wrap=True)
    results = load(exp_dir)
    report = Report(results, Path(out) if out else Path(exp_dir) / "analysis")
    kind = "LR sweep" if results.is_lr_sweep else "ladder"
    console.print(f"{kind} {Path(exp_dir).resolve().name}: {len(results.runs)} runs", style="bold")
    if results.is_lr_sweep:
        _sweep_section(report, console)
    else:
        _ladder_section(report, console, target_params, target_flops, n_bootstrap)
    report.plots.append(plot_loss_curves(results, report.out_dir / "loss_curves.png"))
    for reason in report.skipped:
        console.print(f"skipped {reason}", style="yellow")
    console.print("plots:\n" + "\n".join(f"  {p}" for p in report.plots))
    return report


def _ladder_section(
    report: Report,
    console: Console,
    target_params: float | None,
    target_flops: float | None,
    n_bootstrap: int,
) -> None:
    results = report.results
    final = results.final()
    table = Table(title="final losses per size")
    for col in (
        "size",
        "N",
        "lr",
        "status",
        "steps",
        "tokens",
        "final eval",
        "best eval",
        "final train",
    ):
        table.add_column(col, justify="left" if col in ("size", "status") else "right")
    for row, run in zip(
        final.itertuples(index=False), results.runs.itertuples(index=False), strict=True
    ):
        table.add_row(
            row.size,
            f"{row.N:,}",
            f"{row.lr:.3e}",
            row.status,
            f"{row.step}/{run.total_steps}",
            f"{row.tokens:,}",
            _loss(row.final_eval_loss),
            _loss(row.best_eval_loss),
            _loss(row.final_train_loss),
        )
    console.print(table)

    points = results.fit_points()
    console.print(f"fitting {len(points)} eval points from {points['N'].nunique()} sizes")
    report.chinchilla = _attempt(
        report, "Chinchilla fit", lambda: chinchilla_from_points(points, n_bootstrap)
    )
    report.compute_law = _attempt(
        report, "L(C) fit", lambda: compute_law_from_points(points, n_bootstrap)
    )
    for fit in (report.chinchilla, report.compute_law):
        if fit is not None:
            console.print(str(fit))
    # The held-out fit sees one size fewer; when L(N, D) can't be fitted on the rest, L(C) can.
    laws = [("L(C)", compute_law_from_points)]
    if report.chinchilla is not None:
        laws.insert(0, ("Chinchilla", chinchilla_from_points))
    for name, law in laws:
        report.extrapolation = _attempt(
            report, f"{name} extrapolation check", lambda f=law: extrapolation_check(points, f)
        )
        if report.extrapolation is not None:
            console.print(
                f"extrapolation check ({name} fit without the largest size): {report.extrapolation}"
            )
            break
    wanted = []
    if report.chinchilla is not None:
        if target_params:
            wanted.append((report.chinchilla, {"N": target_params}))
        if target_flops:
            wanted.append((report.chinchilla, {"C": target_flops}))
    if report.compute_law is not None and target_flops:
        wanted.append((report.compute_law, {"C": target_flops}))
    for fit, at in wanted:
        where = ", ".join(f"{k}={v:.3g}" for k, v in at.items())
        prediction = _attempt(
            report, f"prediction at {where}", lambda f=fit, a=at: predict_loss(f, **a)
        )
        if prediction is not None:
            report.predictions.append(prediction)
    for p in report.predictions:
        console.print(f"prediction: {p}")
    if not points.empty:
        report.plots.append(
            plot_loss_vs_compute(
                points,
                report.compute_law,
                report.out_dir / "loss_vs_compute.png",
                report.extrapolation,
            )
        )


def _sweep_section(report: Report, console: Console) -> None:
    table = lr_sweep_table(report.results)
    shown = Table(title="LR sweep")
    for col in ("size", "lr", "final eval", "best eval", "steps", "status"):
        shown.add_column(col, justify="left" if col in ("size", "status") else "right")
    for row in table.itertuples(index=False):
        status = f"{row.status} at {row.diverged_step}" if row.diverged else row.status
        shown.add_row(
            row.size,
            f"{row.lr:.3e}",
            _loss(row.final_eval_loss),
            _loss(row.best_eval_loss),
            f"{row.steps_run}/{row.total_steps}",
            status,
        )
    console.print(shown)
    order = table.groupby("size")["N"].first().sort_values()
    report.optima = optimal_lrs(table)
    for size in order.index:
        if size in report.optima:
            console.print(f"{size}: {report.optima[size]}")
        else:
            report.skipped.append(f"optimal LR of {size}: no trial finished without diverging")
    sizes = list(report.optima)
    n = np.array([order[s] for s in sizes], dtype=float)
    lrs = np.array([report.optima[s].lr for s in sizes])
    report.lr_law = _attempt(report, "LR*(N) fit", lambda: fit_lr_power_law(n, lrs))
    if report.lr_law is not None:
        console.print(str(report.lr_law))
    report.plots.append(plot_lr_sweep(table, report.optima, report.out_dir / "lr_sweep.png"))
    if len(sizes) >= 2:
        err = ([report.optima[s].lr_low for s in sizes], [report.optima[s].lr_high for s in sizes])
        report.plots.append(
            plot_lr_vs_size(n, lrs, report.lr_law, report.out_dir / "lr_vs_size.png", err)
        )


def _attempt(report: Report, what: str, fn):
    try:
        return fn()
    except AnalysisError as e:
        report.skipped.append(f"{what}: {e}")
        return None


def _loss(value: float) -> str:
    return "-" if pd.isna(value) else f"{value:.4f}"
