"""Known-answer task ladders: task loss from a given L(N, D), accuracy from a given sigmoid.

The tests and ``benchmarks/task_coverage.py`` score the two-step prediction against the truth
that drew these points, laid out as a ladder table: several sizes at 1/2/5/10x Chinchilla, each
run with a few checkpoints (step 2's extra points). The noise has a ladder's structure: a
per-size offset in the task loss (runs of one size share a seed), per-point scatter, and the
binomial scatter of an accuracy measured on a finite number of questions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainer_core.analysis.ladder_table import TASK_ACC_SUFFIX, TASK_LOSS_SUFFIX
from trainer_core.analysis.task_sigmoid import _sigmoid


@dataclass(frozen=True)
class TaskTruth:
    """The law that draws a synthetic task: L(N, D) = E + A/N^alpha + B/D^beta, then the
    sigmoid acc(L) = floor + (ceiling - floor) / (1 + exp(k (L - L0))), the floor at chance
    unless given."""

    E: float = 0.5
    A: float = 40.0
    alpha: float = 0.3
    B: float = 300.0
    beta: float = 0.3
    chance: float = 0.25
    ceiling: float = 0.9
    k: float = 6.0
    L0: float = 1.1
    floor: float | None = None

    @property
    def sigmoid(self) -> tuple[float, float, float, float]:
        """(floor, ceiling, k, L0)."""
        floor = self.chance if self.floor is None else self.floor
        return floor, self.ceiling, self.k, self.L0

    def loss(self, N, D):
        return (
            self.E
            + self.A * np.asarray(N, float) ** -self.alpha
            + self.B * np.asarray(D, float) ** -self.beta
        )

    def acc(self, N, D):
        return _sigmoid(self.loss(N, D), *self.sigmoid)


SIZES = (2e7, 5e7, 1e8, 2e8, 4e8)
MULTIPLES = (1, 2, 5, 10)
"""Multiples of Chinchilla's 20 tokens per parameter, as OLMo's ladder."""
CHECKPOINTS = (0.25, 0.5, 0.75, 1.0)


def task_ladder(
    truth: TaskTruth,
    seed: int = 0,
    sizes: tuple[float, ...] = SIZES,
    size_noise: float = 0.01,
    point_noise: float = 0.005,
    questions: int = 2000,
    task: str = "synth",
) -> pd.DataFrame:
    """A ladder table (run, N, D, ``<task>/bpb``, ``<task>/acc``) drawn from ``truth``:
    multiplicative log-normal task-loss noise (``size_noise`` per size, ``point_noise`` per
    point), accuracies binomial over ``questions``."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        offset = rng.normal(0, size_noise)
        for m in MULTIPLES:
            for frac in CHECKPOINTS:
                d = 20 * m * n * frac
                loss = truth.loss(n, d) * np.exp(offset + rng.normal(0, point_noise))
                p = _sigmoid(loss, *truth.sigmoid)
                rows.append(
                    {
                        "run": f"{n:.0e}-{m}xC",
                        "N": n,
                        "D": d,
                        task + TASK_LOSS_SUFFIX: loss,
                        task + TASK_ACC_SUFFIX: rng.binomial(questions, p) / questions,
                    }
                )
    return pd.DataFrame(rows)
