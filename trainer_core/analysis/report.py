"""The experiment report: tables, fits with uncertainty, the held-out check, predictions, PNGs.

``workflows/analyze.py`` prints it for any experiment dir; ``workflows/ladder.py`` and
``workflows/lr_sweep.py`` print it when their runs finish. A fit that the data can't support (too
few sizes or points) is skipped with the reason, never an error: a 2-size demo still gets a report.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pandas as pd
from rich.console import Console

from trainer_core import storage
from trainer_core.analysis.fits import ChinchillaFit, PowerLawFit
from trainer_core.analysis.isoflop import IsoFLOPFit
from trainer_core.analysis.load import AnalysisError, ExperimentResults, load
from trainer_core.analysis.lr import LRPowerLawFit, OptimalLR
from trainer_core.analysis.plots import plot_loss_curves
from trainer_core.analysis.predict import ExtrapolationCheck, LossPrediction
from trainer_core.storage import Location

T = TypeVar("T")


@dataclass
class Report:
    """What :func:`report_experiment` found; ``None`` fits were skipped (reason in ``skipped``)."""

    results: ExperimentResults
    out_dir: Location
    plots: list[Location] = field(default_factory=list)
    chinchilla: ChinchillaFit | None = None
    frontier: PowerLawFit | None = None
    isoflop: IsoFLOPFit | None = None
    target_flops: float | None = None
    extrapolation: ExtrapolationCheck | None = None
    predictions: list[LossPrediction] = field(default_factory=list)
    optima: dict[str, OptimalLR] = field(default_factory=dict)
    lr_law: LRPowerLawFit | None = None
    skipped: list[str] = field(default_factory=list)
    flags: dict[str, list[str]] = field(default_factory=dict)
    """Degenerate-fit warnings per fit name (see ``checks.py``); absent or empty: none."""
    unresolved: dict[str, list[str]] = field(default_factory=dict)
    """Per fit name, the parameters its data leave open (``checks.unresolved``)."""

    def attempt(self, what: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or None with the reason recorded when the data can't support it."""
        try:
            return fn()
        except AnalysisError as e:
            self.skipped.append(f"{what}: {e}")
            return None


def report_experiment(
    exp_dir: Location,
    out: Location | None = None,
    target_params: float | None = None,
    target_flops: float | None = None,
    n_bootstrap: int = 200,
    console: Console | None = None,
) -> Report:
    """Load ``exp_dir``, print the analysis and write PNGs to ``out`` (default ``<exp_dir>/analysis``).

    ``target_flops`` defaults to 10x the largest run's compute: the next rung of the ladder.
    Either may be a URL: the PNGs are drawn in a temporary dir and uploaded, and ``plots`` names
    them where they landed.
    """
    from trainer_core.analysis.report_ladder import ladder_section
    from trainer_core.analysis.report_sweep import sweep_section

    # No markup: run names and paths may contain [brackets]; long lines stay whole for grep.
    console = console or Console(width=120, markup=False, soft_wrap=True)
    results = load(exp_dir)
    out = storage.normalize(out or storage.join(exp_dir, "analysis"))
    with tempfile.TemporaryDirectory(prefix="rayladder-plots-") as tmp:
        report = Report(results, Path(tmp) if storage.is_url(out) else Path(out))
        name = storage.name(storage.normalize(exp_dir, absolute=True))
        kind = "LR sweep" if results.is_lr_sweep else "ladder"
        console.print(f"{kind} {name}: {len(results.runs)} runs", style="bold")
        if results.is_lr_sweep:
            sweep_section(report, console)
        else:
            ladder_section(report, console, target_params, target_flops, n_bootstrap)
        report.plots.append(plot_loss_curves(results, report.out_dir / "loss_curves.png"))
        if storage.is_url(out):
            storage.upload_dir(report.out_dir, str(out))
            report.plots = [storage.join(out, p.name) for p in report.plots]
            report.out_dir = out
    for reason in report.skipped:
        console.print(f"skipped {reason}", style="yellow")
    console.print("plots:\n" + "\n".join(f"  {p}" for p in report.plots))
    return report


def fmt_loss(value: float) -> str:
    return "-" if pd.isna(value) else f"{value:.4f}"
