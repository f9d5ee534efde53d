"""The experiment report: tables, fits with uncertainty, the held-out check, predictions, PNGs.

``workflows/analyze.py`` prints it for any experiment dir; ``workflows/ladder.py`` and
``workflows/lr_sweep.py`` print it when their runs finish. A fit that the data can't support (too
few sizes or points) is skipped with the reason, never an error: a 2-size demo still gets a report.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console

from trainer_core.analysis.ladder_table import AUTO
from trainer_core.analysis.load import load
from trainer_core.analysis.plots import plot_loss_curves
from trainer_core.analysis.report_data import Report
from trainer_core.analysis.report_ladder import ladder_section
from trainer_core.analysis.report_sweep import sweep_section
from trainer_core.analysis.target import TargetSettings
from trainer_core.io import storage
from trainer_core.io.run_dir import ANALYSIS, REPORT_TEXT
from trainer_core.io.storage import Location


def report_experiment(
    exp_dir: Location,
    out: Location | None = None,
    target_params: float | None = None,
    target_flops: float | None = None,
    n_bootstrap: int = 200,
    console: Console | None = None,
    target: TargetSettings | None = None,
    task_accuracy: str = AUTO,
) -> Report:
    """Load ``exp_dir``, print the analysis and write PNGs to ``out`` (default ``<exp_dir>/analysis``).

    ``target_flops`` defaults to 10x the largest run's compute: the next rung of the ladder.
    Either may be a URL: the PNGs are drawn in a temporary dir and uploaded, and ``plots`` names
    them where they landed. ``target`` prices and tunes the target table (device, MFU, sweep);
    ``task_accuracy`` is the accuracy the task prediction fits (``auto``: ``acc_pmi`` where a
    task has it, else ``acc``). What is printed is also written to ``report.txt`` beside the
    PNGs (a job's stdout lives in its logs), unless a ``console`` that does not record is given.
    """
    # No markup: run names and paths may contain [brackets]; long lines stay whole for grep.
    console = console or Console(width=120, markup=False, soft_wrap=True, record=True)
    results = load(exp_dir)
    out = storage.canonical(out) if out else storage.join(results.path, ANALYSIS)
    with tempfile.TemporaryDirectory(prefix="rayladder-plots-") as tmp:
        report = Report(results, Path(tmp) if storage.is_url(out) else Path(out))
        name = storage.name(results.path)
        console.print(f"{results.kind} {name}: {len(results.runs)} runs", style="bold")
        if results.is_lr_sweep:
            sweep_section(report, console)
        else:
            ladder_section(
                report, console, target_params, target_flops, n_bootstrap, target, task_accuracy
            )
        report.plots.append(plot_loss_curves(results, report.out_dir / "loss_curves.png"))
        for reason in report.skipped:
            console.print(f"skipped {reason}", style="yellow")
        written = [p.name for p in report.plots] + ([REPORT_TEXT] if console.record else [])
        console.print("written:\n" + "\n".join(f"  {storage.join(out, n)}" for n in written))
        if console.record:
            (report.out_dir / REPORT_TEXT).write_text(console.export_text(clear=False))
        if storage.is_url(out):
            storage.upload_dir(report.out_dir, str(out))
            report.plots = [storage.join(out, p.name) for p in report.plots]
            report.out_dir = out
    return report
