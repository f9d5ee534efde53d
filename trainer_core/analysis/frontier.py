"""The compute-optimal frontier: the lower envelope of the annealed points over compute, and
L(C) = E + A C^-alpha fitted to it.

Fitting L(C) to every point mixes in over-trained small models and under-trained early points,
which sit above the frontier at their compute and bend the law. The envelope keeps, at each
budget, the lowest loss any size reaches there. Its two ends are left out: below the second
smallest size's first point only the smallest size was trained, too large for those budgets,
and above the second largest size's last point only the largest, over-trained there.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from trainer_core.analysis.bootstrap import (
    fits_every_point,
    no_noise_to_redraw,
    parallel_map,
    residual_resamples,
)
from trainer_core.analysis.curves import budget_grid, size_curves
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.fits import (
    CHINCHILLA_SIZE_PARAMS,
    ChinchillaFit,
    PowerLawFit,
    fit_chinchilla,
    fit_loss_vs_compute,
    power_law_theta,
    require_fit_points,
)
from trainer_core.analysis.solver import BOOTSTRAP_STARTS

MIN_FRONTIER_POINTS = 3


def frontier_points(
    points: pd.DataFrame, trim_ends: bool = True, loss: np.ndarray | None = None
) -> pd.DataFrame:
    """(flops, eval_loss, size) of the envelope at every budget some size covers, without the
    single-size ends when ``trim_ends``; ``loss`` replaces ``points.eval_loss`` (resamples)."""
    curves = size_curves(points, loss)
    budgets = budget_grid(curves, 1, "frontier")
    if trim_ends and len(curves) >= 2:
        lo, hi = curves[1].log_c[0], curves[-2].log_c[-1]
        budgets = budgets[(budgets >= lo) & (budgets <= hi)]
    rows = []
    for x in budgets:
        loss_at, size = min((c.loss(x), c.size) for c in curves if c.covers(x))
        rows.append({"flops": float(np.exp(x)), "eval_loss": loss_at, "size": size})
    return pd.DataFrame(rows, columns=["flops", "eval_loss", "size"])


def _envelope(points: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """The trimmed envelope, or the whole one when trimming leaves too few budgets."""
    front = frontier_points(points)
    if len(front) >= MIN_FRONTIER_POINTS:
        return front, True
    return frontier_points(points, trim_ends=False), False


def fit_frontier(
    points: pd.DataFrame,
    n_bootstrap: int = 200,
    seed: int = 0,
    smoother: ChinchillaFit | None = None,
) -> PowerLawFit:
    """L(C) fitted to the envelope of ``points`` (annealed N, tokens, flops, eval_loss, size).

    Bootstrap: each resample redraws the points' noise around ``smoother`` (an L(N, D) fit of the
    same points, fitted here when not given) and rebuilds the envelope before refitting. The
    refits spread around the frontier fitted to the smoother's noise-free points, not around
    this fit (the demo's envelope sat off it: every printed estimate, the answer's loss too,
    fell outside its own interval); they are moved onto this fit (:meth:`PowerLawFit.from_samples`:
    parameters for their intervals, predictions by ratio), and the report says when the two
    disagree beyond the refits' spread (:func:`~trainer_core.analysis.checks.unresolved`).
    Without such an L(N, D) (3 sizes at least) the fit has no intervals, and says why
    (``no_intervals``).
    """
    require_fit_points("fit_frontier", points)
    if points["size"].nunique() < 2:
        raise AnalysisError("frontier needs annealed points from >= 2 sizes")
    front, trimmed = _envelope(points)
    if len(front) < MIN_FRONTIER_POINTS:
        raise AnalysisError(
            f"frontier: only {len(front)} compute budgets on the envelope, need "
            f"{MIN_FRONTIER_POINTS}; add annealed points (more decays or longer runs)"
        )
    _require_sizes_on_envelope(front)
    title = "frontier L(C) = E + A * C^-alpha"
    if not trimmed:
        title += "   (envelope with its single-size ends: the sizes barely overlap in compute)"
    full = fit_loss_vs_compute(front["flops"], front["eval_loss"], n_bootstrap=0)
    theta = np.array([np.log(full.E), np.log(full.A), full.alpha])
    samples, reference, why = np.empty((0, 3)), None, ""
    if n_bootstrap > 0 and not fits_every_point(len(front), len(theta)):
        smoother, why = _resample_basis(points, smoother)
        if smoother is not None:
            samples = _bootstrap(points, smoother, trimmed, n_bootstrap, seed)
            noise_free = np.log(np.asarray(smoother.predict_frame(points), dtype=float))
            reference = _refit_envelope(points, trimmed, noise_free)
    min_loss = float(points["eval_loss"].min())
    fit = PowerLawFit.from_samples(
        theta, samples, len(front), full.objective, title, reference, min_loss, full.centre["C"]
    )
    fit.n_sizes = points["size"].nunique() if len(samples) else 0
    fit.no_intervals = why or fit.no_intervals
    return fit


def _require_sizes_on_envelope(front: pd.DataFrame) -> None:
    """Refuse an envelope that is one size's own points: a fit to them is that size's learning
    curve, extrapolated as if it were the frontier (a 2-size demo ladder whose smaller size stayed
    lowest wherever both were trained gave its curve, carried 27x past it, as the answer)."""
    sizes = front["size"].unique()
    if len(sizes) < 2:
        raise AnalysisError(
            f"frontier: the envelope is {sizes[0]}'s at all {len(front)} of its compute budgets "
            f"(no other size is lowest at any), so L(C) would be {sizes[0]}'s own learning curve "
            "extrapolated, not a frontier; add sizes, or spread each size's annealed points over "
            "more compute (duration.chinchilla_multiple, duration.decay_points)"
        )


def _resample_basis(
    points: pd.DataFrame, smoother: ChinchillaFit | None
) -> tuple[ChinchillaFit | None, str]:
    """(the L(N, D) to redraw the points' noise around, None and why there is none)."""
    if smoother is None:
        smoother, error = _fit_smoother(points)
        if smoother is None:
            return None, (
                "no 95% intervals: the bootstrap redraws the points' noise around an L(N, D) fit "
                f"of the same points, and they have none ({error})"
            )
    n_params = len(smoother.params())
    if fits_every_point(smoother.n_points, n_params):
        law = "L(N, D), which the resamples are drawn around,"
        return None, no_noise_to_redraw(smoother.n_points, n_params, law)
    return smoother, ""


def chinchilla_smoother(points: pd.DataFrame) -> ChinchillaFit | None:
    """The L(N, D) fit that bootstrap resamples are drawn around, None when it can't be fitted."""
    return _fit_smoother(points)[0]


def _fit_smoother(points: pd.DataFrame) -> tuple[ChinchillaFit | None, str]:
    """(the L(N, D) fit of ``points``, "") or (None, why it can't be fitted)."""
    try:
        fit = fit_chinchilla(points["N"], points["tokens"], points["eval_loss"], n_bootstrap=0)
    except AnalysisError as e:
        return None, str(e)
    return fit, ""


def smoother_resamples(
    points: pd.DataFrame, smoother: ChinchillaFit, n: int, seed: int
) -> np.ndarray:
    """(n, points) log losses redrawn around ``smoother``, a size's points sharing an offset."""
    log_loss = np.log(points["eval_loss"].to_numpy(float))
    fitted = np.log(np.asarray(smoother.predict_frame(points), dtype=float))
    return residual_resamples(
        log_loss,
        fitted,
        points["size"].to_numpy(),
        5,
        n,
        np.random.default_rng(seed),
        CHINCHILLA_SIZE_PARAMS,
    )


def _bootstrap(
    points: pd.DataFrame, smoother: ChinchillaFit, trimmed: bool, n: int, seed: int
) -> np.ndarray:
    resamples = smoother_resamples(points, smoother, n, seed)
    return np.array(parallel_map(partial(_refit_envelope, points, trimmed), resamples))


def _refit_envelope(points: pd.DataFrame, trimmed: bool, log_loss: np.ndarray) -> np.ndarray:
    """(log E, log A, alpha) of L(C) on the envelope of one resample."""
    front = frontier_points(points, trimmed, np.exp(log_loss))
    return power_law_theta(
        front["flops"].to_numpy(float), front["eval_loss"].to_numpy(float), BOOTSTRAP_STARTS
    )
