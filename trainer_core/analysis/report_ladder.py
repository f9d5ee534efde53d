"""The ladder half of the report: what a scaling-law team reads.

Per-size final losses; L(N, D) (approach 3), the frontier L(C) and the isoFLOP line (approach 2)
with bootstrap intervals and degenerate-fit flags; the compute-optimal N, D and loss at a target
budget by each approach side by side, with LR* and B* from a sweep's laws and the cost in
device-hours; the largest size held out and predicted by both laws.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
from rich.console import Console
from rich.table import Table

from trainer_core.analysis.checks import (
    fit_flags,
    format_flags,
    isoflop_flags,
    isoflop_unresolved,
    unresolved,
)
from trainer_core.analysis.frontier import fit_frontier, frontier_points
from trainer_core.analysis.isoflop import fit_isoflop
from trainer_core.analysis.ladder_table import AUTO
from trainer_core.analysis.load import UNKNOWN_STATUS
from trainer_core.analysis.plots_scaling import plot_isoflops, plot_loss_vs_compute
from trainer_core.analysis.predict import (
    chinchilla_from_points,
    extrapolation_check,
    predict_loss,
)
from trainer_core.analysis.report_data import Report, fmt_loss
from trainer_core.analysis.report_tasks import task_section
from trainer_core.analysis.target import (
    FlopsPerToken,
    TargetSettings,
    sweep_laws,
    target_answer,
)
from trainer_core.io.run_dir import OPEN_STATUSES

TARGET_MULTIPLE = 10.0
"""Default target budget: this many times the largest run's compute (the ladder's next rung)."""


def ladder_section(
    report: Report,
    console: Console,
    target_params: float | None,
    target_flops: float | None,
    n_bootstrap: int,
    target: TargetSettings | None = None,
    task_accuracy: str = AUTO,
) -> None:
    _final_table(report, console)
    points = report.results.fit_points()
    if points.empty:
        report.skipped.append(f"scaling-law fits: {_why_no_points(report.results.runs)}")
        return
    if points["size"].nunique() < 2:
        # a run dir, or a ladder with one size done: no fit, target or held-out check to give
        report.skipped.append(
            f"scaling-law fits: annealed points of one size ({points['size'].iloc[0]}); the fits "
            "need >= 2 sizes"
        )
        _plot_points(report, points)
        task_section(report, console, n_bootstrap, task_accuracy)
        return
    min_loss = float(points["eval_loss"].min())
    console.print(f"fitting {len(points)} annealed points from {points['N'].nunique()} sizes")
    report.chinchilla = report.attempt(
        "L(N, D) fit", lambda: chinchilla_from_points(points, n_bootstrap)
    )
    report.frontier = report.attempt(
        "frontier L(C) fit",
        lambda: fit_frontier(points, n_bootstrap, smoother=report.chinchilla),
    )
    report.isoflop = report.attempt(
        "isoFLOP fit", lambda: fit_isoflop(points, n_bootstrap, smoother=report.chinchilla)
    )
    for name, fit, flags, open_params in (
        ("L(N, D)", report.chinchilla, lambda f: fit_flags(f, min_loss), unresolved),
        ("frontier L(C)", report.frontier, lambda f: fit_flags(f, min_loss), unresolved),
        ("isoFLOP", report.isoflop, isoflop_flags, lambda f, _: isoflop_unresolved(f)),
    ):
        if fit is not None:
            report.flags[name] = flags(fit)
            report.unresolved[name] = open_params(fit, min_loss)
            console.print(fit.describe(flags=False))  # its flags follow, in colour
            _print_flags(console, report.flags[name])
            if report.unresolved[name]:
                console.print(format_flags(report.unresolved[name], "UNRESOLVED"), style="yellow")

    _target_section(report, console, points, target_flops, target or TargetSettings())

    report.extrapolation = report.attempt(
        "held-out check", lambda: extrapolation_check(points, n_bootstrap)
    )
    if report.extrapolation is not None:
        console.print(_held_out_table(report))
        for p in report.extrapolation.predictions:
            report.flags[f"held-out {p.law}"] = p.flags
            report.unresolved[f"held-out {p.law}"] = p.notes
            if p.flags or p.notes:
                console.print(
                    f"held-out {p.law} fit (without {report.extrapolation.held_out_size}):"
                )
                _print_flags(console, p.flags)
            if p.notes:
                console.print(format_flags(p.notes, "UNRESOLVED"), style="yellow")
        for law, why in report.extrapolation.skipped:
            report.skipped.append(f"held-out {law}: {why}")

    if target_params is not None:
        _target_size_prediction(report, console, target_params, target_flops)

    _plot_points(report, points)
    if report.isoflop is not None:
        path = report.out_dir / "isoflops.png"
        report.plots.append(plot_isoflops(report.isoflop, report.chinchilla, path))
    task_section(report, console, n_bootstrap, task_accuracy)


def _target_size_prediction(
    report: Report, console: Console, target_params: float, target_flops: float | None
) -> None:
    """L(N, D) at --target-params: trained on --target-flops when given (D = C / 6N), on the
    fit's compute-optimal D for N otherwise; a budget the user named was once replaced by the
    compute-optimal one, 10x it on the demo."""
    what = f"prediction at N={target_params:.3g}"
    if report.chinchilla is None:
        report.skipped.append(f"{what}: it needs the L(N, D) fit")
        return
    prediction = report.attempt(
        what, lambda: predict_loss(report.chinchilla, N=target_params, C=target_flops)
    )
    if prediction is not None:
        report.predictions.append(prediction)
        console.print(f"prediction: {prediction}")


def _target_section(
    report: Report,
    console: Console,
    points: pd.DataFrame,
    target_flops: float | None,
    settings: TargetSettings,
) -> None:
    """The target compute and the table at it; none without a fitted law (a table of row
    labels alone, headed as if it held an answer)."""
    if all(fit is None for fit in (report.isoflop, report.chinchilla, report.frontier)):
        report.skipped.append("target table: no law was fitted (each fit's skipped line says why)")
        return
    if target_flops is not None:
        report.target_flops = target_flops
        console.print(f"target compute {target_flops:.3g} FLOPs (--target-flops)")
    else:
        report.target_flops = TARGET_MULTIPLE * float(points["flops"].max())
        console.print(
            f"target compute {report.target_flops:.3g} FLOPs ({TARGET_MULTIPLE:g}x the largest "
            "run's; --target-flops sets it)"
        )
    console.print(_target_table(report, settings, float(points["flops"].min())))


def _plot_points(report: Report, points: pd.DataFrame) -> None:
    """Loss vs compute: the annealed points, with the frontier's fit and the held-out check
    where the report has them."""
    front = report.attempt("frontier points", lambda: frontier_points(points))
    path = report.out_dir / "loss_vs_compute.png"
    report.plots.append(
        plot_loss_vs_compute(
            points, report.frontier, front, path, report.extrapolation, report.target_flops
        )
    )


def _print_flags(console: Console, flags: list[str]) -> None:
    if flags:
        console.print(format_flags(flags), style="bold red")


def _why_no_points(runs: pd.DataFrame) -> str:
    """ "Yet" only while a run may still write one (running, or interrupted and resumable): a
    ladder whose runs all ended (diverged, failed, stopped) will not gain points by waiting."""
    counts = runs["status"].value_counts()
    statuses = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    if not set(counts.index) & {*OPEN_STATUSES, UNKNOWN_STATUS}:
        return f"no annealed eval points: every run ended without one ({statuses})"
    return f"no annealed eval points yet ({statuses})"


def _final_table(report: Report, console: Console) -> None:
    results = report.results
    table = Table(title="final losses per size")
    cols = (
        "size",
        "N",
        "peak lr",
        "status",
        "steps",
        "tokens",
        "final eval",
        "best eval",
        "final train",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("size", "status") else "right")
    for row, run in zip(
        results.final().itertuples(index=False), results.runs.itertuples(index=False), strict=True
    ):
        table.add_row(
            row.size,
            f"{row.N:,}",
            f"{row.peak_lr:.3e}",
            _status(row.status, run.workers),
            f"{row.step}/{run.total_steps}",
            f"{row.tokens:,}",
            fmt_loss(row.final_eval_loss),
            fmt_loss(row.best_eval_loss),
            fmt_loss(row.final_train_loss),
        )
    console.print(table)


def _status(status: str, workers: object) -> str:
    """A run's status, with how often it started where more than once (a worker group lost and
    restarted, or the run resumed): the final table is where a restart would otherwise go
    unseen (``run.json``'s ``workers`` has each start)."""
    starts = len(workers) if isinstance(workers, list) else 1
    return f"{status}, {starts} starts" if starts > 1 else status


def _target_table(report: Report, settings: TargetSettings, least_flops: float) -> Table:
    """The whole answer at the target compute (:func:`target_answer`), kept on the report;
    a target below every annealed point (``least_flops``) is said to be extrapolated back."""
    cost, sweeps = settings.resolve(report.results.path)
    cost = replace(cost, per_token=FlopsPerToken.of_runs(report.results.runs))
    laws = None
    if sweeps:
        laws = report.attempt(
            f"lr*, B* laws of {sweeps}",
            lambda: sweep_laws(sweeps.lr, sweeps.batch_law, batch_sweep=sweeps.batch),
        )
    answer = target_answer(
        report.target_flops,
        cost,
        report.isoflop,
        report.chinchilla,
        report.frontier,
        laws,
        laws.rules.lr_dir if laws is not None else str(sweeps),
    )
    if report.target_flops < least_flops:
        answer.notes.append(
            f"the target {report.target_flops:.3g} FLOPs is below the ladder's least annealed "
            f"point ({least_flops:.3g}): every column is extrapolated back, past the smallest runs"
        )
    report.target = answer
    table = Table(title=answer.title, caption="\n".join(answer.footer()), caption_justify="left")
    table.add_column("")
    for col in answer.columns:
        table.add_column(col.approach, justify="right")
    for label, cells in answer.rows():
        table.add_row(label, *cells)
    return table


def _held_out_table(report: Report) -> Table:
    check = report.extrapolation
    table = Table(
        title=f"held out: {check.held_out_size} (N={check.held_out_N:,}), predicted from the "
        "smaller sizes vs its measured eval loss (L(N, D) at its final point, the frontier at "
        "its point nearest the compute-optimal split)"
    )
    for col in ("law", "at", "predicted", "95% interval", "measured", "error"):
        table.add_column(col, justify="left" if col in ("law", "at") else "right")
    for p in check.predictions:
        lo, hi = p.interval
        table.add_row(
            p.law,
            p.at,
            f"{p.predicted:.4f}",
            f"{lo:.4f} .. {hi:.4f}" if math.isfinite(lo) else "-",
            f"{p.actual:.4f}",
            f"{100 * p.rel_error:+.2f}%",
        )
    return table
