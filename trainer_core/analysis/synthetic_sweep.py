"""Known-answer hyperparameter sweeps: LR x batch grids per (N, D) cell around a planted
LR*(N, D) and B*(N, D), for the tests and ``benchmarks/hparam_coverage.py``.

The loss is L0(N, D) plus a parabola in log LR and one in log batch, plus Gaussian noise: the
shape the cell fits assume near the optimum, so what is scored is the estimation (optima,
intervals, the law's bootstrap), not a model mismatch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class PlantedLaw:
    """c N^a D^b."""

    c: float
    a: float
    b: float

    def __call__(self, N: float, D: float) -> float:
        return self.c * N**self.a * D**self.b


STEP_LAW_LR = PlantedLaw(1.79, -0.713, 0.307)
"""Step Law (Li et al. 2025): LR* = 1.79 N^-0.713 D^0.307."""
STEP_LAW_BATCH = PlantedLaw(0.58, 0.0, 0.571)
"""Step Law: B* = 0.58 D^0.571 tokens, independent of N."""
SIZES = (5e7, 1e8, 2e8, 4e8)
RATIOS = (20.0, 60.0, 180.0)
"""Tokens per parameter of each size's horizons in the default sweep."""


def default_cells() -> list[tuple[float, float]]:
    return [(n, n * r) for n in SIZES for r in RATIOS]


@dataclass
class SyntheticSweep:
    """A grid of ``n_lr`` LRs (factor sqrt 2) x ``n_batch`` batches (factor 2) per (N, D) cell,
    each centred near the planted optimum with a random offset of up to +-0.4 in log units (so
    the optimum is never on a grid point), or moved by ``lr_shift[(N, D)]`` (a factor: 0.1 puts
    the LR optimum past the grid's top)."""

    lr_law: PlantedLaw = STEP_LAW_LR
    batch_law: PlantedLaw = STEP_LAW_BATCH
    cells: list[tuple[float, float]] = field(default_factory=default_cells)
    noise: float = 0.003
    n_lr: int = 9
    n_batch: int = 6
    lr_curvature: float = 0.05
    batch_curvature: float = 0.03
    lr_shift: dict[tuple[float, float], float] = field(default_factory=dict)

    def table(self, seed: int = 0) -> pd.DataFrame:
        """One row per trial: N, D, lr, batch (tokens), loss."""
        rng = np.random.default_rng(seed)
        lr_steps = 2 ** (np.arange(self.n_lr) / 2 - (self.n_lr - 1) / 4)
        batch_steps = 2.0 ** (np.arange(self.n_batch) - (self.n_batch - 1) / 2)
        rows = []
        for n, d in self.cells:
            lr0, b0 = self.lr_law(n, d), self.batch_law(n, d)
            shift = self.lr_shift.get((n, d), 1.0)
            lrs = shift * lr0 * math.exp(rng.uniform(-0.4, 0.4)) * lr_steps
            batches = b0 * math.exp(rng.uniform(-0.4, 0.4)) * batch_steps
            base = 2 + 400 / n**0.3 + 400 / d**0.3
            for lr in lrs:
                for b in batches:
                    loss = base + self.lr_curvature * math.log(lr / lr0) ** 2
                    loss += self.batch_curvature * math.log(b / b0) ** 2
                    rows.append((n, d, lr, b, loss + self.noise * rng.standard_normal()))
        return pd.DataFrame(rows, columns=["N", "D", "lr", "batch", "loss"])
