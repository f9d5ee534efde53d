"""Held-out checks of a hyperparameter law: fit without one cell, predict that cell's optimum.

What a sweep's law is worth beyond its own cells: the measured optimum of a cell the fit never
saw should fall inside the law's interval there widened by the cell's own measurement error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainer_core.analysis.bootstrap import percentile_interval
from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.hparam_laws import (
    N_BOOTSTRAP,
    SIGMA_FLOOR,
    SYMBOL,
    CellOptimum,
    fit_hparam_law,
)


@dataclass
class HparamHeldOut(ShownAsText):
    """One cell left out of the law: its measured optimum against the law's prediction.

    ``interval`` is where the cell's measurement should fall: the law's bootstrap at the cell
    plus the cell's own measurement error (its interval, times the law's scatter when above 1).
    """

    measured: CellOptimum
    predicted: float
    law_interval: tuple[float, float]
    interval: tuple[float, float]

    @property
    def covered(self) -> bool:
        lo, hi = self.interval
        return lo <= self.measured.value <= hi

    def __str__(self) -> str:
        m = self.measured
        lo, hi = self.interval
        verdict = "inside" if self.covered else "OUTSIDE"
        return (
            f"held out {m.label}: predicted {SYMBOL[m.param]} = {self.predicted:.4g} "
            f"(law 95% {self.law_interval[0]:.4g} .. {self.law_interval[1]:.4g}; "
            f"with the cell's own error {lo:.4g} .. {hi:.4g}), measured {m.value:.4g}: {verdict}"
        )


def held_out_check(
    cells: list[CellOptimum],
    N: float,
    D: float,
    terms: tuple[str, ...] = ("N", "D"),
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> HparamHeldOut:
    """Fit the law without the (N, D) cell and predict that cell's optimum."""
    held = [c for c in cells if math.isclose(c.N, N) and math.isclose(c.D, D)]
    if not held or held[0].at_edge:
        raise AnalysisError(f"no bracketed cell at N={N:.3g} D={D:.3g} to hold out")
    cell = held[0]
    law = fit_hparam_law([c for c in cells if c is not cell], terms, n_bootstrap, seed)
    predicted, lo, hi = law.predict(N, D)
    x = law.log_row(N, D)
    own = max(cell.log_sigma, SIGMA_FLOOR) * max(law.scatter, 1.0)
    rng = np.random.default_rng(seed + 1)
    logs = law.draws @ x + own * rng.standard_normal(len(law.draws))
    plo, phi = percentile_interval(logs)
    return HparamHeldOut(cell, predicted, (lo, hi), (math.exp(plo), math.exp(phi)))


def leave_one_out(
    cells: list[CellOptimum],
    terms: tuple[str, ...] = ("N", "D"),
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> list[HparamHeldOut]:
    """held_out_check of every bracketed cell in turn."""
    return [
        held_out_check(cells, c.N, c.D, terms, n_bootstrap, seed) for c in cells if not c.at_edge
    ]
