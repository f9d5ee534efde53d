"""Using the scaling-law fits: fitting from a points table, extrapolation checks, predictions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from trainer_core.analysis.fits import (
    ChinchillaFit,
    PowerLawFit,
    fit_chinchilla,
    fit_loss_vs_compute,
)
from trainer_core.analysis.load import AnalysisError


def chinchilla_from_points(
    points: pd.DataFrame, n_bootstrap: int = 0, seed: int = 0
) -> ChinchillaFit:
    return fit_chinchilla(points["N"], points["tokens"], points["eval_loss"], n_bootstrap, seed)


def compute_law_from_points(
    points: pd.DataFrame, n_bootstrap: int = 0, seed: int = 0
) -> PowerLawFit:
    return fit_loss_vs_compute(points["flops"], points["eval_loss"], n_bootstrap, seed)


@dataclass
class ExtrapolationCheck:
    """A fit without the largest size, scored on that size's points (headline: its last point)."""

    held_out_size: str
    held_out_N: int
    tokens: int
    predicted: float
    actual: float
    rel_error: float
    points: pd.DataFrame
    """Every held-out point: tokens, flops, actual, predicted, rel_error."""

    def __str__(self) -> str:
        return (
            f"held out {self.held_out_size} (N={self.held_out_N:,}) at {self.tokens:,} tokens: "
            f"predicted {self.predicted:.4f}, actual {self.actual:.4f}, "
            f"error {100 * self.rel_error:+.2f}%"
        )


def extrapolation_check(
    points: pd.DataFrame,
    fit_fn: Callable[[pd.DataFrame], ChinchillaFit | PowerLawFit] = chinchilla_from_points,
) -> ExtrapolationCheck:
    """Refit without the largest N and predict its losses; rel_error = (pred - actual) / actual."""
    if points["N"].nunique() < 2:
        raise AnalysisError("extrapolation_check needs points from at least 2 sizes")
    largest = points["N"].max()
    held = points[points["N"] == largest].sort_values("tokens")
    fit = fit_fn(points[points["N"] != largest])
    predicted = fit.predict_frame(held)
    actual = held["eval_loss"].to_numpy(float)
    table = (
        held[["tokens", "flops"]].assign(actual=actual, predicted=predicted).reset_index(drop=True)
    )
    table["rel_error"] = (table["predicted"] - table["actual"]) / table["actual"]
    last = table.iloc[-1]
    return ExtrapolationCheck(
        held_out_size=str(held["size"].iloc[-1]),
        held_out_N=int(largest),
        tokens=int(last["tokens"]),
        predicted=float(last["predicted"]),
        actual=float(last["actual"]),
        rel_error=float(last["rel_error"]),
        points=table,
    )


@dataclass
class LossPrediction:
    """A predicted loss and the (N, D, C) it was predicted at; ``how`` says what was assumed."""

    loss: float
    N: float | None
    D: float | None
    C: float | None
    how: str

    def __str__(self) -> str:
        parts = [f"{k}={v:.3g}" for k, v in (("N", self.N), ("D", self.D), ("C", self.C)) if v]
        return f"L = {self.loss:.4f} at {', '.join(parts)} ({self.how})"


def predict_loss(
    fit: ChinchillaFit | PowerLawFit,
    N: float | None = None,
    D: float | None = None,
    C: float | None = None,
) -> LossPrediction:
    """Loss at a size, a token count and/or a compute budget (C = 6 N D for the Chinchilla fit).

    Chinchilla fit: any two of N, D, C fix the third; one alone is completed on the fit's
    compute-optimal frontier. L(C) power law: needs C.
    """
    given = {k: v for k, v in (("N", N), ("D", D), ("C", C)) if v is not None}
    if not given:
        raise AnalysisError("predict_loss: give N, D and/or C")
    if isinstance(fit, PowerLawFit):
        if C is None:
            raise AnalysisError("predict_loss: the L(C) power law needs a compute budget C")
        return LossPrediction(float(fit.predict(C)), N, D, C, "L(C) power law")
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
    return LossPrediction(
        float(fit.predict(N, D)), float(N), float(D), 6 * float(N) * float(D), how
    )
