"""Using the scaling-law fits: fitting from a points table, the held-out check, predictions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trainer_core.analysis.bootstrap import percentile_interval
from trainer_core.analysis.checks import fit_flags, too_few_sizes
from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.fits import (
    ChinchillaFit,
    PowerLawFit,
    fit_chinchilla,
    require_fit_points,
    require_positive,
)
from trainer_core.analysis.frontier import fit_frontier, smoother_resamples
from trainer_core.analysis.load import analysis_flops

LAW_CHINCHILLA = "L(N, D)"
LAW_FRONTIER = "frontier L(C)"


def chinchilla_from_points(
    points: pd.DataFrame, n_bootstrap: int = 0, seed: int = 0
) -> ChinchillaFit:
    """Approach 3 on a points table (``ExperimentResults.fit_points()``: N, tokens, eval_loss,
    size); the points of one size share a bootstrap offset."""
    require_fit_points("chinchilla_from_points", points, ("size", "N", "tokens", "eval_loss"))
    return fit_chinchilla(
        points["N"], points["tokens"], points["eval_loss"], n_bootstrap, seed, points["size"]
    )


@dataclass
class HeldOutPrediction(ShownAsText):
    """One law's prediction of a held-out point's loss, with the interval a measurement of it
    should fall in: the law's bootstrap spread and the noise one measured point carries
    (:func:`measurement_noise`)."""

    law: str
    at: str
    predicted: float
    interval: tuple[float, float]
    actual: float
    flops: float = math.nan
    """The compute of the point scored (the frontier's need not be the final one)."""
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the interval leaves out (:func:`~trainer_core.analysis.checks.too_few_sizes`)."""

    @property
    def rel_error(self) -> float:
        return (self.predicted - self.actual) / self.actual

    @property
    def covers(self) -> bool:
        lo, hi = self.interval
        return lo <= self.actual <= hi

    def __str__(self) -> str:
        lo, hi = self.interval
        ci = f" (95% {lo:.4f} .. {hi:.4f})" if math.isfinite(lo) else " (no interval)"
        return (
            f"{self.law} at {self.at}: predicted {self.predicted:.4f}{ci}, measured "
            f"{self.actual:.4f}, error {100 * self.rel_error:+.2f}%"
        )


@dataclass
class ExtrapolationCheck(ShownAsText):
    """Both laws fitted without the largest size, scored on that size's final (annealed) eval."""

    held_out_size: str
    held_out_N: int
    tokens: int
    flops: float
    actual: float
    predictions: list[HeldOutPrediction]
    skipped: list[str]
    """Laws that could not be fitted on the smaller sizes, with the reason."""
    points: pd.DataFrame
    """Every held-out point: tokens, flops, actual, and one predicted column per law."""
    fits: dict[str, ChinchillaFit | PowerLawFit] = field(default_factory=dict)
    """The laws fitted without the held-out size, by law name."""

    def prediction(self, law: str) -> HeldOutPrediction | None:
        return next((p for p in self.predictions if p.law == law), None)

    def __str__(self) -> str:
        lines = [
            f"held out {self.held_out_size} (N={self.held_out_N:,}), final eval at "
            f"{self.tokens:,} tokens, {self.flops:.3g} FLOPs:"
        ]
        lines += [f"  {p}" for p in self.predictions]
        lines += [f"  {law}: skipped ({why})" for law, why in self.skipped]
        return "\n".join(lines)


def extrapolation_check(
    points: pd.DataFrame, n_bootstrap: int = 0, seed: int = 0
) -> ExtrapolationCheck:
    """Fit L(N, D) and the frontier L(C) without the largest N and predict its loss.

    L(N, D) predicts the final point, at its N and D. The frontier claims the best loss at a
    compute, which a point trained at another split of it does not reach: it is scored at the
    held-out point nearest the compute-optimal split L(N, D) (fitted without it) gives, the final
    one when there is no such fit, and says so when even that one is far off. Either law may be
    skipped (too few sizes left), not both.
    """
    require_fit_points("extrapolation_check", points)
    if points["N"].nunique() < 2:
        raise AnalysisError("extrapolation_check needs points from at least 2 sizes")
    largest = points["N"].max()
    held = points[points["N"] == largest].sort_values("tokens")
    rest = points[points["N"] != largest]
    last = held.iloc[-1]
    table = held[["tokens", "flops"]].assign(actual=held["eval_loss"]).reset_index(drop=True)
    fits: dict[str, ChinchillaFit | PowerLawFit] = {}
    laws = {
        LAW_CHINCHILLA: lambda: chinchilla_from_points(rest, n_bootstrap, seed),
        # Resampled around the L(N, D) just fitted, when it could be.
        LAW_FRONTIER: lambda: fit_frontier(
            rest, n_bootstrap, seed, smoother=fits.get(LAW_CHINCHILLA)
        ),
    }
    predictions, skipped = [], []
    noise = None
    for law, fit_law in laws.items():
        try:
            fit = fits[law] = fit_law()
        except AnalysisError as e:
            skipped.append((law, str(e)))
            continue
        table[law] = fit.predict_frame(held)
        notes = too_few_sizes(fit)
        if law == LAW_CHINCHILLA:
            point, where = last, (largest, last["tokens"])
            at = f"N={largest:.3g}, D={last['tokens']:.3g}"
        else:
            point, off = _nearest_the_frontier(fits.get(LAW_CHINCHILLA), held)
            where, at = (point["flops"],), f"C={point['flops']:.3g}"
            notes += off
        samples = fit.predict_samples(*where)
        if law == LAW_CHINCHILLA and samples.size:
            noise = measurement_noise(rest, fit, samples.size, seed + 1)
        if noise is not None and samples.size:
            samples = samples * np.exp(noise)  # both n_bootstrap long
        predictions.append(
            HeldOutPrediction(
                law,
                at,
                float(fit.predict(*where)),
                percentile_interval(samples),
                float(point["eval_loss"]),
                float(point["flops"]),
                fit_flags(fit, rest["eval_loss"].min()),
                notes,
            )
        )
    if not predictions:
        reasons = "; ".join(f"{law}: {why}" for law, why in skipped)
        raise AnalysisError(f"held-out check: no law fits the smaller sizes ({reasons})")
    return ExtrapolationCheck(
        held_out_size=str(last["size"]),
        held_out_N=int(largest),
        tokens=int(last["tokens"]),
        flops=float(last["flops"]),
        actual=float(last["eval_loss"]),
        predictions=predictions,
        skipped=skipped,
        points=table,
        fits=fits,
    )


def measurement_noise(rest: pd.DataFrame, law: ChinchillaFit, n: int, seed: int) -> np.ndarray:
    """``n`` draws of the log deviation of one measured point from L(N, D), as the fitted sizes
    show it (a size's offset and the point's own scatter, resampled and inflated as the
    bootstrap's): the law's spread alone is an interval for its mean, which one measured loss
    missed 1 time in 5 on synthetic ladders where it should have 1 in 20."""
    drawn = smoother_resamples(rest, law, n, seed)
    fitted = np.log(np.asarray(law.predict_frame(rest), dtype=float))
    columns = np.random.default_rng(seed).integers(0, fitted.size, size=n)
    return drawn[np.arange(n), columns] - fitted[columns]


OFF_FRONTIER = 2.0
"""A held-out point whose tokens per parameter differ from the compute-optimal ratio by more
than this factor is not on the frontier: measured above L(C) by design."""


def _nearest_the_frontier(
    law: ChinchillaFit | None, held: pd.DataFrame
) -> tuple[pd.Series, list[str]]:
    """The held-out point whose tokens per parameter are nearest the compute-optimal ratio at
    its compute (by L(N, D) without it; the final point when there is none), and a note when
    even that one is off the frontier: it then sits above L(C) by design, which its error does
    not tell apart from a wrong law."""
    if law is None or not law.has_frontier:
        return held.iloc[-1], []
    ratios = held["tokens"].to_numpy(float) / held["N"].to_numpy(float)
    optima = np.array([d / n for n, d in (law.compute_optimal(float(c)) for c in held["flops"])])
    gaps = np.abs(np.log(ratios / optima))
    i = int(np.argmin(gaps))
    if gaps[i] < np.log(OFF_FRONTIER):
        return held.iloc[i], []
    return held.iloc[i], [
        f"the held-out point nearest the frontier has {ratios[i]:.3g} tokens a parameter, L(N, D) "
        f"puts that budget's optimum at {optima[i]:.3g}: off the frontier, it sits above L(C) by "
        "design, so this error is not the frontier's alone (the L(N, D) row tests this size)"
    ]


@dataclass
class LossPrediction(ShownAsText):
    """A predicted loss and the (N, D, C) it was predicted at; ``how`` says what was assumed,
    ``interval`` is the fit's bootstrap interval there (NaNs without a bootstrap)."""

    loss: float
    N: float | None
    D: float | None
    C: float | None
    how: str
    interval: tuple[float, float] = (math.nan, math.nan)

    def __str__(self) -> str:
        parts = [f"{k}={v:.3g}" for k, v in (("N", self.N), ("D", self.D), ("C", self.C)) if v]
        lo, hi = self.interval
        ci = f" (95% {lo:.4f} .. {hi:.4f})" if math.isfinite(lo) else ""
        return f"L = {self.loss:.4f}{ci} at {', '.join(parts)} ({self.how})"


COMPUTE_RTOL = 1e-6
"""N, D and C all given must agree with C = 6 N D to this relative tolerance (rounding only)."""


def _require_consistent(N: float, D: float, C: float) -> None:
    """N, D and C all given: one of them is redundant, and a C that is not 6 N D was a budget
    the prediction would silently drop for 6 N D (1e18 became 5.88e21 for N 7e9, D 140e9)."""
    implied = analysis_flops(float(N), float(D))
    if abs(implied - float(C)) > COMPUTE_RTOL * float(C):
        raise AnalysisError(
            f"predict_loss: N={N:.3g}, D={D:.3g} and C={C:.3g} disagree (6 N D = {implied:.3g}); "
            "give two of them, or a C equal to 6 N D"
        )


def predict_loss(
    fit: ChinchillaFit | PowerLawFit,
    N: float | None = None,
    D: float | None = None,
    C: float | None = None,
) -> LossPrediction:
    """Loss at a size, a token count and/or a compute budget (C = 6 N D for the Chinchilla fit).

    Chinchilla fit: any two of N, D, C fix the third (all three must agree); one alone is
    completed on the fit's compute-optimal frontier. L(C) power law: needs C. With a bootstrap,
    the prediction carries the fit's interval at the point predicted.
    """
    given = {k: v for k, v in (("N", N), ("D", D), ("C", C)) if v is not None}
    if not given:
        raise AnalysisError("predict_loss: give N, D and/or C")
    given = {name: require_positive(f"predict_loss: {name}", v) for name, v in given.items()}
    N, D, C = (given.get(name) for name in ("N", "D", "C"))
    if isinstance(fit, PowerLawFit):
        if C is None:
            raise AnalysisError("predict_loss: the L(C) power law needs a compute budget C")
        interval = fit.predict_interval(C)
        return LossPrediction(float(fit.predict(C)), N, D, C, "L(C) power law", interval)
    if len(given) == 3:
        _require_consistent(N, D, C)
    if N is not None and D is not None:
        how = "given N and D"
    elif N is not None and C is not None:
        D, how = C / (6 * N), "D = C / 6N"
    elif D is not None and C is not None:
        N, how = C / (6 * D), "N = C / 6D"
    elif C is not None:
        N, D = fit.compute_optimal(C)
        how = "compute-optimal N, D for C"
    elif N is not None:
        D, how = fit.optimal_tokens(N), "compute-optimal D for N"
    else:
        N = fit.optimal_params(D)
        how = "compute-optimal N for D"
    n, d = float(N), float(D)
    interval = fit.predict_interval(n, d)
    return LossPrediction(float(fit.predict(n, d)), n, d, analysis_flops(n, d), how, interval)
