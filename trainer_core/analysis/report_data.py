"""What an experiment report found: fits, predictions, plots and the reasons a fit was skipped.

The report sections (``report_ladder``, ``report_sweep``) fill one :class:`Report`; the dispatcher
(``report.py``) picks the sections and prints what they leave.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import pandas as pd

from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.fits import ChinchillaFit, PowerLawFit
from trainer_core.analysis.isoflop import IsoFLOPFit
from trainer_core.analysis.load import ExperimentResults
from trainer_core.analysis.lr import LRPowerLawFit, OptimalLR
from trainer_core.analysis.predict import ExtrapolationCheck, LossPrediction
from trainer_core.analysis.target import TargetAnswer
from trainer_core.analysis.tasks import TaskReport
from trainer_core.io.storage import Location

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
    target: TargetAnswer | None = None
    """The whole answer at ``target_flops``: N*, D*, loss, LR*, B* and device-hours."""
    extrapolation: ExtrapolationCheck | None = None
    predictions: list[LossPrediction] = field(default_factory=list)
    task_holdout: TaskReport | None = None
    """The two-step task prediction of the held-out size beside what it measured."""
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
            self.skipped.append(_labelled(what, str(e)))
            return None


def _labelled(what: str, why: str) -> str:
    """``<what>: <why>``, the why's own opening label dropped where ``what`` is or begins with
    it: an error naming its fit ("isoFLOP: ...") under the report's name for that fit would
    read "isoFLOP fit: isoFLOP: ..."."""
    label, said, rest = why.partition(": ")
    if said and label and (what == label or what.startswith(f"{label} ")):
        return f"{what}: {rest}"
    return f"{what}: {why}"


def fmt_loss(value: float) -> str:
    return "-" if pd.isna(value) else f"{value:.4f}"
