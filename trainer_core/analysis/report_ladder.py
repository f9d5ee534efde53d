"""The ladder half of the report: what a scaling-law team reads.

Per-size final losses; L(N, D) (approach 3), the frontier L(C) and the isoFLOP line (approach 2)
with bootstrap intervals and degenerate-fit flags; the compute-optimal N, D and loss at a target
budget by each approach side by side; the largest size held out and predicted by both laws.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from trainer_core.analysis.checks import (
    fit_flags,
    format_flags,
    isoflop_flags,
    isoflop_unresolved,
    unresolved,
)
from trainer_core.analysis.fits import ChinchillaFit
from trainer_core.analysis.frontier import fit_frontier, frontier_points
from trainer_core.analysis.isoflop import IsoFLOPFit, fit_isoflop
from trainer_core.analysis.load import AnalysisError
from trainer_core.analysis.plots_scaling import plot_isoflops, plot_loss_vs_compute
from trainer_core.analysis.predict import (
    chinchilla_from_points,
    extrapolation_check,
    predict_loss,
)
from trainer_core.analysis.report_data import Report, fmt_loss

TARGET_MULTIPLE = 10.0
"""Default target budget: this many times the largest run's compute (the ladder's next rung)."""


def ladder_section(
    report: Report,
    console: Console,
    target_params: float | None,
    target_flops: float | None,
    n_bootstrap: int,
) -> None:
    _final_table(report, console)
    points = report.results.fit_points()
    if points.empty:
        report.skipped.append("scaling-law fits: no annealed eval points yet")
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
            console.print(str(fit))
            _print_flags(console, report.flags[name])
            if report.unresolved[name]:
                console.print(format_flags(report.unresolved[name], "UNRESOLVED"), style="yellow")

    if target_flops:
        report.target_flops = target_flops
        console.print(f"target compute {target_flops:.3g} FLOPs (--target-flops)")
    else:
        report.target_flops = TARGET_MULTIPLE * float(points["flops"].max())
        console.print(
            f"target compute {report.target_flops:.3g} FLOPs ({TARGET_MULTIPLE:g}x the largest "
            "run's; --target-flops sets it)"
        )
    console.print(_optimum_table(report, report.target_flops))

    report.extrapolation = report.attempt(
        "held-out check", lambda: extrapolation_check(points, n_bootstrap)
    )
    if report.extrapolation is not None:
        console.print(_held_out_table(report))
        for p in report.extrapolation.predictions:
            report.flags[f"held-out {p.law}"] = p.flags
            if p.flags:
                console.print(
                    f"held-out {p.law} fit (without {report.extrapolation.held_out_size}):"
                )
                _print_flags(console, p.flags)
        for law, why in report.extrapolation.skipped:
            report.skipped.append(f"held-out {law}: {why}")

    if report.chinchilla is not None and target_params:
        prediction = report.attempt(
            f"prediction at N={target_params:.3g}",
            lambda: predict_loss(report.chinchilla, N=target_params),
        )
        if prediction is not None:
            report.predictions.append(prediction)
            console.print(f"prediction: {prediction}")

    out = report.out_dir
    front = report.attempt("frontier points", lambda: frontier_points(points))
    report.plots.append(
        plot_loss_vs_compute(
            points, report.frontier, front, out / "loss_vs_compute.png", report.extrapolation
        )
    )
    if report.isoflop is not None:
        report.plots.append(plot_isoflops(report.isoflop, report.chinchilla, out / "isoflops.png"))


def _print_flags(console: Console, flags: list[str]) -> None:
    if flags:
        console.print(format_flags(flags), style="bold red")


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
            row.status,
            f"{row.step}/{run.total_steps}",
            f"{row.tokens:,}",
            fmt_loss(row.final_eval_loss),
            fmt_loss(row.best_eval_loss),
            fmt_loss(row.final_train_loss),
        )
    console.print(table)


def _with_ci(value: float, ci: tuple[float, float], fmt: str) -> str:
    if not math.isfinite(value):
        return "-"
    text = format(value, fmt)
    lo, hi = ci
    return text + (f" [{lo:{fmt}} .. {hi:{fmt}}]" if math.isfinite(lo) else "")


ROWS = ("a: N_opt ~ C^a", "b: D_opt ~ C^b", "N_opt", "D_opt (tokens)", "loss")


def _isoflop_column(fit: IsoFLOPFit, C: float) -> dict[str, str]:
    ci = fit.optimal_intervals(C)
    n_opt, d_opt = fit.compute_optimal(C)
    nan = (math.nan, math.nan)
    return {
        ROWS[0]: _with_ci(fit.a, fit.ci.get("a", nan), ".3f"),
        ROWS[1]: _with_ci(fit.b, fit.ci.get("b", nan), ".3f"),
        ROWS[2]: _with_ci(n_opt, ci["N"], ".3g"),
        ROWS[3]: _with_ci(d_opt, ci["D"], ".3g"),
    }


def _chinchilla_column(fit: ChinchillaFit, C: float) -> dict[str, str]:
    """a, b, N_opt, D_opt and loss on the fit's own frontier; only a, b when it has none."""
    ci = fit.optimal_intervals(C)
    column = {
        ROWS[0]: _with_ci(fit.a, ci["a"], ".3f"),
        ROWS[1]: _with_ci(fit.b, ci["b"], ".3f"),
    }
    try:
        n_opt, d_opt = fit.compute_optimal(C)
    except AnalysisError:
        return column
    column[ROWS[2]] = _with_ci(n_opt, ci["N"], ".3g")
    column[ROWS[3]] = _with_ci(d_opt, ci["D"], ".3g")
    column[ROWS[4]] = _with_ci(fit.predict(n_opt, d_opt), ci["loss"], ".4f")
    return column


def _optimum_table(report: Report, C: float) -> Table:
    columns = {
        "approach 2 (isoFLOP)": report.isoflop and _isoflop_column(report.isoflop, C),
        "approach 3 (L(N, D))": report.chinchilla and _chinchilla_column(report.chinchilla, C),
        "frontier L(C)": report.frontier
        and {
            ROWS[4]: _with_ci(
                report.frontier.predict(C), report.frontier.predict_interval(C), ".4f"
            )
        },
    }
    table = Table(title=f"compute-optimal at C = {C:.3g} FLOPs (95% bootstrap intervals)")
    table.add_column("")
    for name in columns:
        table.add_column(name, justify="right")
    for row in ROWS:
        table.add_row(row, *((col or {}).get(row, "-") for col in columns.values()))
    return table


def _held_out_table(report: Report) -> Table:
    check = report.extrapolation
    table = Table(
        title=f"held out: {check.held_out_size} (N={check.held_out_N:,}), predicted from the "
        "smaller sizes vs its measured final eval loss"
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
