"""Step 2 of the two-step task prediction: accuracy as a sigmoid of the task loss.

    acc(L) = floor + (ceiling - floor) / (1 + exp(k (L - L0)))

fitted by bounded least squares from several starts (a steep and a gentle sigmoid fit the same
narrow loss range), with a bootstrap over points for intervals. The ceiling is 1 by default,
which is the paper's method in effect (:func:`fit_sigmoid` says why), and the floor is free
(:mod:`trainer_core.analysis.tasks` says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from trainer_core.analysis.bootstrap import CI_LEVEL, Z_CI, parallel_map, percentile_interval
from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError

NEAR_CHANCE = 0.1
"""Accuracies within this fraction of the chance-to-1 range above chance say little of the
ceiling: the sigmoid's top half is never seen."""
CEILING_SPAN = 0.3
"""A ceiling whose 95% interval spans more than this fraction of chance .. 1 is not pinned down."""
K_RANGE = (1e-3, 1e3)
"""Steepness bounds (per unit of task loss); a fit at either has found no sigmoid."""


@dataclass
class SigmoidFit(ShownAsText):
    """acc(L) = floor + (ceiling - floor) / (1 + exp(k (L - L0))); ``chance`` for the flags."""

    chance: float
    floor: float
    ceiling: float
    k: float
    L0: float
    n_points: int
    rmse: float
    samples: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def n_bootstrap(self) -> int:
        return len(self.samples["k"]) if self.samples else 0

    def params(self) -> dict[str, float]:
        return {"floor": self.floor, "ceiling": self.ceiling, "k": self.k, "L0": self.L0}

    def predict(self, L: np.ndarray | float) -> np.ndarray | float:
        out = _sigmoid(np.asarray(L, dtype=float), *self.params().values())
        return float(out) if out.ndim == 0 else out

    def predict_samples(self, L: np.ndarray) -> np.ndarray:
        """The i-th bootstrap sigmoid at ``L[i]`` (a step-1 sample): the chained prediction."""
        s = self.samples
        return _sigmoid(np.asarray(L, dtype=float), *(s[name] for name in PARAMS))

    def __str__(self) -> str:
        lines = [
            "acc(L) = floor + (ceiling - floor) / (1 + exp(k (L - L0)))"
            f"   (chance {self.chance:.3g}; {self.n_points} points, rmse {self.rmse:.3g}, "
            f"{self.n_bootstrap} bootstrap resamples)"
        ]
        for name, value in self.params().items():
            line = f"  {name:<8}= {value:.4g}"
            if name in self.ci and math.isfinite(self.ci[name][0]):
                lo, hi = self.ci[name]
                line += f"   ({100 * CI_LEVEL:.0f}% CI {lo:.4g} .. {hi:.4g})"
            lines.append(line)
        return "\n".join(lines)


PARAMS = ("floor", "ceiling", "k", "L0")


def rise_noise(accuracy: float, examples: float) -> float:
    """How far apart two scores of ``accuracy`` on ``examples`` examples each fall by chance
    alone, 1 time in 20 (:data:`Z_CI` standard errors of their difference); 0 where the count
    is unknown."""
    if not (math.isfinite(examples) and examples >= 1):
        return 0.0
    return Z_CI * math.sqrt(2 * accuracy * (1 - accuracy) / examples)


def _sigmoid(L, floor, ceiling, k, L0):
    with np.errstate(over="ignore"):
        return floor + (ceiling - floor) / (1 + np.exp(k * (L - L0)))


def _fit_sigmoid_once(
    loss: np.ndarray,
    acc: np.ndarray,
    chance: float,
    fixed: dict[str, float],
    starts: list[np.ndarray],
) -> tuple[np.ndarray, float]:
    """Best (floor, ceiling, k, L0) from ``starts`` by bounded least squares, and its mean
    square; the parameters in ``fixed`` keep their values."""
    lo = np.array([0.0, chance, K_RANGE[0], loss.min() - 5 * np.ptp(loss) - 1])
    hi = np.array([1.0, 1.0, K_RANGE[1], loss.max() + 5 * np.ptp(loss) + 1])
    free = np.array([name not in fixed for name in PARAMS])
    full = np.array([fixed.get(name, np.nan) for name in PARAMS])

    def residuals(p: np.ndarray) -> np.ndarray:
        full[free] = p
        return _sigmoid(loss, *full) - acc

    best, best_cost = None, math.inf
    for x0 in starts:
        x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)[free]
        res = least_squares(residuals, x0, bounds=(lo[free], hi[free]), method="trf")
        if res.cost < best_cost:
            best, best_cost = res.x, res.cost
    full[free] = best
    return full.copy(), 2 * best_cost / loss.size


def _starts(loss: np.ndarray, acc: np.ndarray, chance: float) -> list[np.ndarray]:
    """A few starts spanning the steepness scale: a steep and a gentle sigmoid fit the same
    narrow loss range, and least squares stays in the basin it starts in."""
    ceiling = min(1.0, chance + 1.5 * max(acc.max() - chance, 1e-3))
    scale = max(np.ptp(loss), 1e-3)
    return [
        np.array([floor, c, k / scale, loss.mean() + shift * scale])
        for floor in (chance, float(acc.min()))
        for c in (ceiling, 1.0)
        for k in (1.0, 4.0, 12.0)
        for shift in (-0.5, 0.5)
    ]


def _refit_resample(
    loss: np.ndarray,
    acc: np.ndarray,
    chance: float,
    fixed: dict[str, float],
    theta: np.ndarray,
    idx: np.ndarray,
) -> np.ndarray:
    """The parameters refitted to the points ``idx`` (one bootstrap resample), started at the
    fit's own ``theta`` and a third of the usual starts."""
    starts = [theta, *_starts(loss[idx], acc[idx], chance)[::3]]
    return _fit_sigmoid_once(loss[idx], acc[idx], chance, fixed, starts)[0]


def fit_sigmoid(
    loss: np.ndarray | pd.Series,
    acc: np.ndarray | pd.Series,
    chance: float,
    n_bootstrap: int = 200,
    seed: int = 0,
    ceiling: float | None = 1.0,
    floor: float | None = None,
) -> SigmoidFit:
    """Step 2 on (task loss, accuracy) points; the bootstrap resamples points with replacement.

    ``ceiling``: the accuracy as the task loss falls, fixed at 1 by default (None: fitted). This
    is what Bhagia et al. (2024) do in effect: their sigmoid has four free parameters, but their
    fit (OLMo-ladder, ``src/fitting/step2.py``) adds an ideal point, task loss 0 at accuracy 1,
    and bounds the ceiling at 1, so it comes out at 0.99 .. 1.00; fitted so on OLMo's ladder, the
    13B predictions of six tasks equal those of a ceiling fixed at 1 within 0.003. A ladder
    rarely sees the sigmoid bend over, and a free ceiling without that point settles on its best
    accuracy: on OLMo's ladder ARC-Challenge's came out 0.49, where the 7B scored 0.62.
    ``floor``: the accuracy at high task loss, fitted by default within 0 .. 1 (a number:
    fixed there, e.g. ``floor=chance``). Fitted, it reproduces the paper's own step-2 errors on
    OLMo's 13B (benchmarks/RESULTS.md, "Step 2's floor"), and it follows a metric that
    plateaus above chance.
    """
    loss, acc = np.asarray(loss, dtype=float).ravel(), np.asarray(acc, dtype=float).ravel()
    if loss.size != acc.size or loss.size < 4:
        raise AnalysisError(f"fit_sigmoid needs >= 4 (loss, acc) pairs, got {loss.size}/{acc.size}")
    if not (np.all(np.isfinite(loss)) and np.all(np.isfinite(acc))):
        raise AnalysisError("fit_sigmoid: every task loss and accuracy must be finite")
    if not 0 <= chance < 1:
        raise AnalysisError(f"fit_sigmoid: chance = {chance} is not in 0 .. 1")
    if floor is not None and not 0 <= floor < 1:
        raise AnalysisError(f"fit_sigmoid: floor = {floor} is not in 0 .. 1")
    if ceiling is not None and not (chance < ceiling <= 1 and ceiling > (floor or 0)):
        raise AnalysisError(
            f"fit_sigmoid: ceiling = {ceiling} must lie above chance ({chance}) and the floor, "
            "and at most 1"
        )
    fixed = {k: v for k, v in (("floor", floor), ("ceiling", ceiling)) if v is not None}
    theta, mse = _fit_sigmoid_once(loss, acc, chance, fixed, _starts(loss, acc, chance))
    resamples = np.random.default_rng(seed).integers(0, loss.size, (n_bootstrap, loss.size))
    refit = partial(_refit_resample, loss, acc, chance, fixed, theta)
    refits = parallel_map(refit, resamples)
    samples = {}
    if refits:
        arr = np.array(refits)
        samples = {name: arr[:, i] for i, name in enumerate(PARAMS)}
    fitted = [name for name in samples if name not in fixed]
    return SigmoidFit(
        chance,
        *(float(v) for v in theta),
        loss.size,
        math.sqrt(mse),
        samples,
        {name: percentile_interval(samples[name]) for name in fitted},
    )


def sigmoid_flags(fit: SigmoidFit, acc: np.ndarray, examples: float = math.nan) -> list[str]:
    """What the accuracies leave open: a ceiling never approached, a rise no larger than the
    scores' own sampling noise (on ``examples`` examples each, where known), a steepness at
    its bound."""
    notes = []
    span = 1 - fit.chance
    top, bottom = float(np.max(acc)), float(np.min(acc))
    noise = rise_noise(float(np.mean(acc)), examples)
    if top - bottom < noise:
        notes.append(
            f"noise: the accuracies span {bottom:.3g} .. {top:.3g}, less than two scores on "
            f"{examples:,.0f} examples differ by chance alone 1 time in 20 ({noise:.3g}): the "
            "rise is not resolved, so the sigmoid's step is a guess (score more examples)"
        )
    if top - fit.chance < NEAR_CHANCE * span:
        notes.append(
            f"ceiling: every accuracy is within {NEAR_CHANCE:.0%} of chance ({fit.chance:.3g}; "
            f"best {top:.3g}): the sigmoid's rise is not seen, so its ceiling and step are guesses"
        )
    elif top - bottom < NEAR_CHANCE * span:
        notes.append(
            f"rise: every accuracy lies in {bottom:.3g} .. {top:.3g}, within {NEAR_CHANCE:.0%} "
            f"of chance .. 1 of each other (chance {fit.chance:.3g}): a plateau, not a rise, so "
            "the sigmoid's floor, step and ceiling are guesses"
        )
    elif "ceiling" in fit.ci:
        lo, hi = fit.ci["ceiling"]
        if hi - lo > CEILING_SPAN * span:
            notes.append(
                f"ceiling: 95% CI {lo:.3g} .. {hi:.3g}: the accuracies stop short of where the "
                "sigmoid bends over; predictions beyond the measured range are loose"
            )
    if not K_RANGE[0] * 1.01 < fit.k < K_RANGE[1] / 1.01:
        notes.append(f"k = {fit.k:.3g} is at its bound: no sigmoid in these points")
    if fit.floor > fit.ceiling:
        notes.append(
            f"floor {fit.floor:.3g} above ceiling {fit.ceiling:.3g}: accuracy falling as the "
            "task loss falls; no sigmoid in these points"
        )
    return notes
