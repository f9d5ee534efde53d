"""Feeding an LR sweep back into a ladder: ``lr: {from_sweep: <sweep dir>}``.

The sweep's per-size optima are fitted as LR*(N) = a * N^b; the ladder then takes its peak LR
from that fit for every size, and records the source in each run's config dump and run.json.
"""

from __future__ import annotations

from collections.abc import Callable

from trainer_core.config.loader import ConfigError
from trainer_core.io import storage
from trainer_core.ladder.formulas import LRFormula


def lr_function(formula: LRFormula) -> Callable[[int], float] | None:
    """None for the formula LR; else N -> fitted LR*(N) from the sweep dir."""
    if not formula.from_sweep:
        return None
    from trainer_core.analysis import AnalysisError, fit_sweep_lr

    sweep_dir = storage.normalize(formula.from_sweep)
    try:
        fit = fit_sweep_lr(sweep_dir)
    except AnalysisError as e:
        raise ConfigError(f"lr.from_sweep: {str(sweep_dir)!r} can't give an LR fit: {e}") from None
    return fit.predict
