"""Is a fit usable? The signs of a degenerate fit, as lines a reader sees beside the numbers.

A fit can converge and still say nothing: E pushed to zero or above every observed loss (the
other terms absorbed it), an exponent at a bound, intervals that did not come out finite.
"""

from __future__ import annotations

import math

from trainer_core.analysis.bootstrap import percentile_interval
from trainer_core.analysis.fits import (
    CHINCHILLA_SIZE_PARAMS,
    FRONTIER_MIN,
    ChinchillaFit,
    PowerLawFit,
)
from trainer_core.analysis.isoflop import MIN_BUDGETS, IsoFLOPFit

EXPONENT_RANGE = (0.05, 2.0)
"""Exponents outside this range are not scaling laws a ladder can support."""
E_ZERO_FRACTION = 1e-3
"""E is fitted in log space, so it never reaches 0: below this fraction of the smallest observed
loss it counts as zero."""


def fit_flags(fit: ChinchillaFit | PowerLawFit, min_loss: float) -> list[str]:
    """Why ``fit`` (fitted to losses no lower than ``min_loss``) is degenerate; empty if it isn't."""
    flags = []
    e = fit.E
    if e <= E_ZERO_FRACTION * min_loss:
        flags.append(f"E = {e:.3g} is zero in effect (the irreducible loss was not identified)")
    elif e >= min_loss:
        flags.append(f"E = {e:.4g} is not below the smallest observed loss {min_loss:.4g}")
    lo, hi = EXPONENT_RANGE
    for name in fit.EXPONENTS:
        value = getattr(fit, name)
        if not lo <= value <= hi:
            flags.append(f"{name} = {value:.3g} is outside {lo} .. {hi}")
    flags.extend(_ci_flags(fit.ci, fit.n_bootstrap))
    return flags


def isoflop_flags(fit: IsoFLOPFit) -> list[str]:
    flags = []
    if not fit.splits_compute:
        flags.append(f"a = {fit.a:.3g}: N_opt and D_opt do not both grow with compute")
    flags.extend(_ci_flags(fit.ci, fit.n_bootstrap))
    return flags


def _ci_flags(ci: dict[str, tuple[float, float]], n_bootstrap: int) -> list[str]:
    if n_bootstrap == 0:
        return []
    bad = [name for name, bounds in ci.items() if not all(math.isfinite(v) for v in bounds)]
    return [f"non-finite 95% CI of {', '.join(bad)}"] if bad else []


COEFFICIENT_SPAN = 100.0
"""A coefficient whose 95% interval spans more than this factor is not identified on its own."""
FAILED_RESAMPLES = 0.05
"""The share of isoFLOP resamples without a slope above which its interval is called truncated."""
SPLIT_RANGE = (0.0, 1.0)
"""Every possible split of compute between N and D: an interval for ``a`` covering all of it
says nothing about the split."""


def too_few_sizes(fit: ChinchillaFit | PowerLawFit | IsoFLOPFit) -> list[str]:
    """Intervals that leave out the run-to-run noise between sizes. Every bootstrap here draws
    around an L(N, D) whose E, A and alpha vary between sizes; with no more sizes than that, they
    absorb the size offsets whole, and the resamples keep only the within-size scatter (held-out
    predictions from 3 of 4 synthetic sizes with 2% size noise: 6 of 12 intervals held the truth)."""
    if fit.n_bootstrap == 0 or not 0 < fit.n_sizes <= CHINCHILLA_SIZE_PARAMS:
        return []
    return [
        f"95% intervals: {fit.n_sizes} sizes leave the noise between sizes no degree of freedom, "
        "so the intervals are too narrow; a 4th size gives it one"
    ]


def unresolved(fit: ChinchillaFit | PowerLawFit, min_loss: float) -> list[str]:
    """What the bootstrap says ``fit``'s data do not pin down (a fit need not be degenerate to
    leave a parameter open): E's or an exponent's interval reaching zero, coefficients that trade
    off with their exponent over orders of magnitude, intervals without the noise between sizes,
    a frontier away from the law its resamples were drawn around. Without a bootstrap, why there
    is none (``no_intervals``)."""
    if fit.n_bootstrap == 0:
        return [fit.no_intervals] if fit.no_intervals else []
    notes = too_few_sizes(fit)
    lo, hi = fit.ci["E"]
    if lo <= E_ZERO_FRACTION * min_loss:
        notes.append(
            f"E: 95% CI {lo:.2g} .. {hi:.3g} reaches zero: the irreducible loss is not pinned down "
            "by these sizes (a wider range of N, or longer runs, would)"
        )
    notes += _exponents_reaching_zero(fit)
    notes += _coefficient_spans(fit)
    if isinstance(fit, PowerLawFit):
        notes += _frontier_off_its_reference(fit)
    return notes


EXPONENT_VARIABLES = {"alpha": "N", "beta": "D"}
"""What each L(N, D) exponent scales; L(C)'s one exponent scales compute."""


def _exponents_reaching_zero(fit: ChinchillaFit | PowerLawFit) -> list[str]:
    """Exponents whose interval reaches the fitter's bound at zero (``FRONTIER_MIN``): at least
    one refit in 40 found the loss flat in that variable, so the data do not show it falling."""
    notes = []
    for name in fit.EXPONENTS:
        lo, hi = fit.ci.get(name, (math.nan, math.nan))
        if lo <= FRONTIER_MIN:
            var = "compute" if isinstance(fit, PowerLawFit) else EXPONENT_VARIABLES[name]
            notes.append(
                f"{name}: 95% CI {lo:.2g} .. {hi:.3g} reaches zero: these sizes do not show the "
                f"loss falling with {var} (a wider range of N, or longer runs, would)"
            )
    return notes


def _coefficient_spans(fit: ChinchillaFit | PowerLawFit) -> list[str]:
    """Coefficients whose interval spans more than ``COEFFICIENT_SPAN``: traded off against
    their exponent, so not identified on their own. Their term at the points' centre
    (:meth:`~trainer_core.analysis.fits.FitStats.term_at_centre`) is given with them: free of
    that trade-off, though not of E's (on the demo's frontier, 1.11 with 95% CI 0.80 .. 2.09
    against A's 2.06 .. 1.28e3, E's interval 0.17 .. 0.37)."""
    notes = []
    for name in fit.TERMS:
        if name not in fit.ci:
            continue
        lo, hi = fit.ci[name]
        if not (lo > 0 and hi / lo > COEFFICIENT_SPAN):
            continue
        note = (
            f"{name}: 95% CI {lo:.3g} .. {hi:.3g} spans {math.log10(hi / lo):.1f} orders of "
            "magnitude, traded off against its exponent; "
        )
        term = fit.term_at_centre(name)
        if term is not None and all(map(math.isfinite, term[3])):
            var, at, value, (t_lo, t_hi) = term
            exponent = fit.TERMS[name][1]
            note += (
                f"its term where the points are, {name} * {var}^-{exponent} at {var} = {at:.3g} "
                f"(their geometric mean), is {value:.3g} (95% CI {t_lo:.3g} .. {t_hi:.3g}); read "
                f"that or the predictions, not {name} alone"
            )
        else:
            note += f"read the predictions, not {name} alone"
        notes.append(note)
    return notes


def _frontier_off_its_reference(fit: PowerLawFit) -> list[str]:
    """A frontier whose alpha lies outside the CI_LEVEL range of its refits as refitted, before
    they were moved onto it.

    Those refits are what this estimator gives on envelopes of ladders drawn around L(N, D):
    an estimate outside their central 95% is one L(N, D) plus the ladder's noise would give
    less than 1 time in 20, so the envelope and L(N, D)'s frontier disagree by more than noise.
    The moved parameter intervals then assume a spread measured around another law, while the
    prediction intervals only carry that law's relative spread at each C over to this fit's
    prediction, whatever the trade-off of E, A and alpha. alpha alone is tested, at the level
    the report prints: it is what the frontier is read for, and E and A trade off with it (on
    the demo all three sit at their refits' 10th percentile: alpha 0.143 against 0.328, a
    factor 2.3 that its noise still gives, so not flagged).
    """
    if fit.reference is None or "alpha" not in fit.samples:
        return []
    lo, hi = percentile_interval(fit.samples["alpha"])
    if not math.isfinite(lo) or lo <= fit.alpha <= hi:
        return []
    return [
        f"alpha = {fit.alpha:.3g} lies outside the 95% range {lo:.3g} .. {hi:.3g} of the refits "
        f"drawn around L(N, D), whose frontier has alpha = {fit.reference[2]:.3g}: the envelope "
        "and L(N, D) disagree beyond the noise, so the intervals of E, A and alpha are "
        "approximate; read the frontier's loss predictions and their intervals, not its parameters"
    ]


def isoflop_unresolved(fit: IsoFLOPFit) -> list[str]:
    """Approach 2 without an answer: ``a``'s interval covers every split of compute."""
    if fit.n_bootstrap == 0 or "a" not in fit.ci:
        return []
    notes = too_few_sizes(fit)
    if not fit.centred:
        notes.append(
            "a: approach 3's fit, which the resamples are drawn around, gives no approach-2 slope "
            "of its own (too few budgets with an inside minimum), so the interval is around its "
            "answer, not centred on this estimate"
        )
    if fit.n_failed > FAILED_RESAMPLES * fit.n_bootstrap:
        notes.append(
            f"a: {fit.n_failed} of {fit.n_bootstrap} resamples had fewer than {MIN_BUDGETS} "
            "budgets with the minimum inside the sizes and gave no slope; the interval is of the "
            "others, so narrower than approach 2's real spread"
        )
    lo, hi = fit.ci["a"]
    if lo <= SPLIT_RANGE[0] and hi >= SPLIT_RANGE[1]:
        return notes + [
            f"a: 95% CI {lo:.2f} .. {hi:.2f} covers every split of compute: approach 2 needs "
            "more sizes around each budget's minimum; take N_opt from approach 3 here"
        ]
    return notes


def format_flags(flags: list[str], label: str = "DEGENERATE") -> str:
    return "\n".join(f"  {label}: {flag}" for flag in flags)
