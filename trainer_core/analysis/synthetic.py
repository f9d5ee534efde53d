"""Known-answer ladders: annealed points drawn from a given L(N, D), laid out as a WSD-S ladder.

The tests and ``benchmarks/fit_coverage.py`` score the fits against the truth that generated
these points, on the grid a ladder writes: several sizes, each with post-decay evals at several
multiples of its Chinchilla token count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trainer_core.analysis.fits import ChinchillaFit
from trainer_core.analysis.load import analysis_flops

CHINCHILLA = ChinchillaFit(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28, n_points=0, objective=0)
"""Hoffmann et al. (2022)'s published L(N, D)."""


@dataclass
class SyntheticLadder:
    """Sizes doubling from ``smallest``, each with annealed points at ``multiples`` x 20 N tokens.

    Noise is multiplicative (log-normal): ``noise`` per point, plus ``size_noise`` shared by all
    points of a size (one training run per size shares its seed and data order).
    """

    law: ChinchillaFit = field(default_factory=lambda: CHINCHILLA)
    smallest: float = 1e7
    n_sizes: int = 7
    multiples: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    noise: float = 0.005
    size_noise: float = 0.0

    @property
    def sizes(self) -> np.ndarray:
        return self.smallest * 2.0 ** np.arange(self.n_sizes)

    def points(self, seed: int = 0) -> pd.DataFrame:
        """The ladder's annealed points, with the columns of ``ExperimentResults.fit_points()``."""
        rng = np.random.default_rng(seed)
        rows = []
        for i, n in enumerate(self.sizes):
            offset = self.size_noise * rng.standard_normal()
            for m in self.multiples:
                tokens = 20.0 * n * m
                clean = float(self.law.predict(n, tokens))
                rows.append(
                    {
                        "size": f"s{i}",
                        "name": f"s{i}",
                        "N": n,
                        "tokens": tokens,
                        "flops": analysis_flops(n, tokens),
                        "eval_loss": clean * np.exp(offset + self.noise * rng.standard_normal()),
                    }
                )
        return pd.DataFrame(rows)
