"""Analysis on synthetic experiment dirs written to disk from known scaling-law constants."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from synthetic_experiments import (
    FRACTIONS,
    LADDER_N,
    TRUE,
    chinchilla_loss,
    make_ladder,
)

from trainer_core.analysis import (
    AnalysisError,
    ChinchillaFit,
    PowerLawFit,
    chinchilla_from_points,
    extrapolation_check,
    fit_chinchilla,
    fit_loss_vs_compute,
    load,
    predict_loss,
    unresolved,
)
from trainer_core.analysis.bootstrap import percentile_interval


def test_chinchilla_fit_recovers_constants(ladder_dir: Path):
    fit = chinchilla_from_points(load(ladder_dir).fit_points(), n_bootstrap=20)
    assert pytest.approx(TRUE["E"], rel=0.02) == fit.E
    assert fit.alpha == pytest.approx(TRUE["alpha"], abs=0.015)
    assert fit.beta == pytest.approx(TRUE["beta"], abs=0.015)
    assert pytest.approx(TRUE["A"], rel=0.15) == fit.A
    assert pytest.approx(TRUE["B"], rel=0.15) == fit.B
    assert fit.n_points == 24 and fit.n_bootstrap == 20
    for name in ("E", "A", "B", "alpha", "beta"):
        lo, hi = fit.ci[name]
        assert lo <= getattr(fit, name) <= hi and fit.std[name] > 0
    text = str(fit)
    assert "L(N, D) = E + A / N^alpha + B / D^beta" in text and text.count("±") == 5


def test_compute_optimal_matches_numeric_minimum():
    fit = ChinchillaFit(**TRUE, n_points=0, objective=0.0)
    c = 1e21
    n_opt, d_opt = fit.compute_optimal(c)
    assert 6 * n_opt * d_opt == pytest.approx(c)
    grid = np.logspace(7, 12, 20001)
    best = grid[np.argmin(fit.predict(grid, c / (6 * grid)))]
    assert n_opt == pytest.approx(best, rel=2e-3)
    assert fit.optimal_tokens(n_opt) == pytest.approx(d_opt, rel=1e-5)
    assert fit.optimal_params(d_opt) == pytest.approx(n_opt, rel=1e-5)


def test_loss_vs_compute_fit_recovers_power_law():
    c = np.logspace(15, 20, 12)
    loss = (1.7 + 800 * c**-0.15) * (1 + 0.001 * np.sin(1.3 * np.arange(12)))
    fit = fit_loss_vs_compute(c, loss, n_bootstrap=20)
    assert pytest.approx(1.7, rel=0.02) == fit.E
    assert pytest.approx(800, rel=0.1) == fit.A
    assert fit.alpha == pytest.approx(0.15, abs=0.005)
    assert fit.predict(1e18) == pytest.approx(1.7 + 800 * 1e18**-0.15, rel=2e-3)
    assert fit.std["alpha"] > 0 and "±" in str(fit)


def test_fit_input_errors():
    with pytest.raises(AnalysisError, match="fit_chinchilla needs >= 5 points, got 2"):
        fit_chinchilla([1e6, 2e6], [1e8, 2e8], [3.0, 2.9])
    with pytest.raises(AnalysisError, match="differ in length"):
        fit_chinchilla([1e6] * 5, [1e8] * 5, [3.0] * 4)
    with pytest.raises(AnalysisError, match=">= 3 model sizes"):
        fit_chinchilla(
            [1e6, 2e6] * 3, [1e8, 2e8, 3e8, 4e8, 5e8, 6e8], [3.0, 2.9, 2.8, 2.7, 2.6, 2.5]
        )
    with pytest.raises(AnalysisError, match="every value of L must be a positive finite"):
        fit_loss_vs_compute([1e15, 1e16, 1e17], [3.0, float("nan"), 2.0])


def test_extrapolation_to_held_out_size_is_accurate(tmp_path: Path):
    pts = load(make_ladder(tmp_path, noise=0.0)).fit_points()
    check = extrapolation_check(pts)
    assert check.held_out_size == "s6" and check.held_out_N == 200_000_000
    assert check.tokens == pts["tokens"].max()
    assert check.actual == pytest.approx(chinchilla_loss(2e8, check.tokens))
    chinchilla, frontier = check.predictions
    assert chinchilla.law == "L(N, D)" and abs(chinchilla.rel_error) < 1e-3
    # Each size's points lie near its compute-optimal tokens here, so the frontier predicts too.
    assert frontier.law == "frontier L(C)" and abs(frontier.rel_error) < 0.01
    assert len(check.points) == len(FRACTIONS)
    rel = check.points["L(N, D)"] / check.points["actual"] - 1
    assert rel.abs().max() < 1e-3


def test_predict_loss_modes():
    fit = ChinchillaFit(**TRUE, n_points=0, objective=0.0)
    both = predict_loss(fit, N=1e9, D=2e10)
    assert (
        both.loss == pytest.approx(chinchilla_loss(1e9, 2e10))
        and pytest.approx(6 * 1e9 * 2e10) == both.C
    )
    by_c = predict_loss(fit, C=1e21)
    n_opt, d_opt = fit.compute_optimal(1e21)
    assert pytest.approx((n_opt, d_opt)) == (by_c.N, by_c.D)
    assert by_c.loss == pytest.approx(chinchilla_loss(n_opt, d_opt))
    by_n = predict_loss(fit, N=1e9)
    assert pytest.approx(fit.optimal_tokens(1e9)) == by_n.D
    assert pytest.approx(1e10) == predict_loss(fit, N=1e9, C=6e19).D
    law = fit_loss_vs_compute(
        np.logspace(15, 20, 8), 1.7 + 800 * np.logspace(15, 20, 8) ** -0.15, n_bootstrap=0
    )
    assert predict_loss(law, C=1e22).loss == pytest.approx(1.7 + 800 * 1e22**-0.15, rel=1e-3)
    with pytest.raises(AnalysisError, match="compute budget"):
        predict_loss(law, N=1e9)
    flat = ChinchillaFit(**{**TRUE, "alpha": 0.0}, n_points=0, objective=0.0)  # loss flat in N
    assert predict_loss(flat, N=1e9, D=2e10).loss == pytest.approx(
        TRUE["E"] + TRUE["A"] + 410 * 2e10**-0.28
    )
    for at in ({"C": 1e21}, {"N": 1e9}, {"D": 1e10}):
        with pytest.raises(AnalysisError, match="alpha=0: .* no compute-optimal N, D"):
            predict_loss(flat, **at)


@pytest.mark.parametrize(
    "at, message",
    [
        ({"N": -5.0}, "predict_loss: N = -5.0: must be a positive finite number"),
        ({"C": 0}, "predict_loss: C = 0: must be a positive finite number"),
        ({"N": 1e9, "D": math.inf}, "predict_loss: D = inf: must be a positive finite number"),
    ],
)
def test_predict_loss_refuses_what_no_law_can_be_read_at(at, message):
    """A negative N once came back from the frontier's fractional powers as a complex number,
    and float() of it failed with no word of N."""
    fit = ChinchillaFit(**TRUE, n_points=0, objective=0.0)
    with pytest.raises(AnalysisError) as err:
        predict_loss(fit, **at)
    assert str(err.value) == message


def test_refits_without_a_frontier_are_left_out_of_every_optimum_interval():
    """A refit with beta at zero has no compute-optimal split: its N_opt came out infinite
    (dropped) but its loss, E + B, was kept, and one such refit in 40 set the loss interval's top
    to hundreds."""
    rng = np.random.default_rng(0)
    samples = {k: np.full(40, float(v)) * rng.uniform(0.98, 1.02, 40) for k, v in TRUE.items()}
    flat = {k: np.append(v, 0.0 if k == "beta" else v[0]) for k, v in samples.items()}
    clean = ChinchillaFit(**TRUE, n_points=0, objective=0.0, samples=samples)
    with_flat = ChinchillaFit(**TRUE, n_points=0, objective=0.0, samples=flat)
    # The same arithmetic on the same 40 refits in one process: equal to the last bit.
    assert with_flat.optimal_intervals(1e21) == clean.optimal_intervals(1e21)


def test_a_negative_bootstrap_count_is_an_error_naming_it():
    n = np.array([1e7, 2e7, 4e7, 8e7, 1e7, 2e7])
    d = np.array([2e8, 4e8, 8e8, 2e9, 4e9, 8e9])
    with pytest.raises(AnalysisError, match=r"^n_bootstrap = -1: must be >= 0"):
        fit_chinchilla(n, d, chinchilla_loss(n, d), n_bootstrap=-1)


DEMO_FRONTIER = np.array([np.log(0.210), np.log(58.0), 0.143])
"""The demo envelope's L(C) (log E, log A, alpha) and the frontier of L(N, D) its bootstrap
resamples were drawn around, which its refits spread about."""
DEMO_REFERENCE = np.array([np.log(0.886), np.log(3675.0), 0.328])


def demo_like_refits(alpha_sd: float) -> np.ndarray:
    """200 refits around the demo's reference, alpha held at the fitter's bound of zero."""
    rng = np.random.default_rng(0)
    refits = DEMO_REFERENCE + rng.standard_normal((200, 3)) * [0.3, 1.0, alpha_sd]
    refits[:, 2] = np.maximum(refits[:, 2], 0.0)
    return refits


def test_a_frontier_exponent_moved_onto_a_shallower_estimate_stays_positive():
    """The demo printed alpha = 0.1431 (95% CI -0.0665 .. 0.3688): refits around the steeper
    reference were shifted by the difference, below the zero the fitter bounds them at. Scaled
    by estimate / reference they keep their sign; predictions still move by the laws' ratio."""
    refits = demo_like_refits(alpha_sd=0.1)
    fit = PowerLawFit.from_samples(DEMO_FRONTIER, refits, 20, 0.0, "t", DEMO_REFERENCE)
    lo, hi = fit.ci["alpha"]
    assert 0 < lo < fit.alpha < hi
    scaled = np.percentile(refits[:, 2] * 0.143 / 0.328, [2.5, 97.5])
    assert (lo, hi) == pytest.approx(tuple(scaled), rel=1e-5)
    assert fit.ci["E"][0] < fit.E < fit.ci["E"][1]
    law = PowerLawFit(0.886, 3675.0, 0.328, n_points=1, objective=0.0)
    own = np.exp(refits[:, 0]) + np.exp(refits[:, 1]) * 1e14 ** -refits[:, 2]
    assert fit.predict_samples(1e14) == pytest.approx(
        own * fit.predict(1e14) / law.predict(1e14), rel=1e-5
    )


def test_an_exponent_whose_interval_reaches_zero_is_unresolved():
    """E reaching zero was said; an exponent reaching its bound at zero (the data allow a loss
    that no longer falls) was not."""
    frontier = PowerLawFit(
        E=0.21,
        A=58.0,
        alpha=0.143,
        n_points=20,
        objective=0.0,
        ci={"E": (0.15, 0.26), "A": (40.0, 90.0), "alpha": (0.0, 0.31)},
        n_bootstrap=200,
    )
    assert unresolved(frontier, min_loss=1.1) == [
        "alpha: 95% CI 0 .. 0.31 reaches zero: these sizes do not show the loss falling with "
        "compute (a wider range of N, or longer runs, would)"
    ]
    ci = {"E": (1.6, 1.8), "A": (300.0, 500.0), "B": (350.0, 470.0), "alpha": (0.3, 0.4)}
    flat_in_d = ChinchillaFit(
        **TRUE, n_points=20, objective=0.0, ci={**ci, "beta": (1e-9, 0.4)}, n_bootstrap=200
    )
    [note] = unresolved(flat_in_d, min_loss=2.0)
    assert note.startswith("beta: 95% CI 1e-09 .. 0.4 reaches zero: these sizes do not show the")
    assert "loss falling with D" in note
    healthy = ChinchillaFit(
        **TRUE, n_points=20, objective=0.0, ci={**ci, "beta": (0.2, 0.4)}, n_bootstrap=200
    )
    assert unresolved(healthy, min_loss=2.0) == []


def test_a_frontier_outside_the_spread_of_its_refits_says_the_two_laws_disagree():
    """Refits drawn around L(N, D)'s frontier give the envelope's fit only within their spread
    if the two agree; one outside it is a disagreement the moved intervals hide."""
    refits = demo_like_refits(alpha_sd=0.02)
    lo, hi = np.percentile(refits[:, 2], [2.5, 97.5])
    apart = PowerLawFit.from_samples(DEMO_FRONTIER, refits, 20, 0.0, "t", DEMO_REFERENCE)
    notes = unresolved(apart, min_loss=1.1)
    assert (
        f"alpha = 0.143 lies outside the 95% range {lo:.3g} .. {hi:.3g} of the refits drawn "
        "around L(N, D), whose frontier has alpha = 0.328: the envelope and L(N, D) disagree "
        "beyond the noise, so the intervals of E, A and alpha are approximate; read the "
        "frontier's loss predictions and their intervals, not its parameters"
    ) in notes
    near = DEMO_FRONTIER.copy()
    near[2] = 0.32
    agreeing = PowerLawFit.from_samples(near, refits, 20, 0.0, "t", DEMO_REFERENCE)
    assert not [n for n in unresolved(agreeing, min_loss=1.1) if "outside the 95% range" in n]
    own = PowerLawFit.from_samples(DEMO_FRONTIER, refits, 20, 0.0, "t")
    assert not [n for n in unresolved(own, min_loss=1.1) if "outside the 95% range" in n]


def traded_off_refits(n_refits: int = 200) -> dict[str, np.ndarray]:
    """Refits of TRUE whose A and alpha trade off as over a ladder's few sizes: alpha spread
    wide, A following it so that the N term at N = 1e7 stays within 2% of TRUE's."""
    rng = np.random.default_rng(0)
    alpha = TRUE["alpha"] + 0.15 * rng.standard_normal(n_refits)
    term = TRUE["A"] * 1e7 ** -TRUE["alpha"] * np.exp(0.01 * rng.standard_normal(n_refits))
    samples = {k: np.full(n_refits, float(v)) for k, v in TRUE.items()}
    return {**samples, "alpha": alpha, "A": term * 1e7**alpha}


def test_a_coefficient_traded_off_with_its_exponent_comes_with_its_term_at_the_centre():
    """A's interval spanning orders of magnitude said only "read the predictions": what the
    points do pin down, the loss A's term adds at their centre, is given with it."""
    samples = traded_off_refits()
    ci = {k: percentile_interval(v) for k, v in samples.items()}
    law = ChinchillaFit(**TRUE, n_points=20, objective=0.0, samples=samples, ci=ci, n_bootstrap=200)
    a_lo, a_hi = ci["A"]
    assert a_hi / a_lo > 1e3
    note = (
        f"A: 95% CI {a_lo:.3g} .. {a_hi:.3g} spans {math.log10(a_hi / a_lo):.1f} orders of "
        "magnitude, traded off against its exponent; "
    )
    assert unresolved(law, min_loss=2.0) == [note + "read the predictions, not A alone"]
    law.centre = {"N": 1e7, "D": 2e8}
    var, at, value, (lo, hi) = law.term_at_centre("A")
    assert (var, at) == ("N", 1e7) and value == pytest.approx(TRUE["A"] * 1e7 ** -TRUE["alpha"])
    assert lo < value < hi and hi / lo < 1.05
    assert unresolved(law, min_loss=2.0) == [
        note + "its term where the points are, A * N^-alpha at N = 1e+07 (their geometric "
        f"mean), is {value:.3g} (95% CI {lo:.3g} .. {hi:.3g}); read that or the predictions, "
        "not A alone"
    ]
    refits = demo_like_refits(alpha_sd=0.05)
    frontier = PowerLawFit.from_samples(
        DEMO_FRONTIER, refits, 20, 0.0, "t", DEMO_REFERENCE, centre=1e13
    )
    own = np.exp(refits[:, 1]) * 1e13 ** -refits[:, 2]
    _, ref_a, ref_alpha = np.exp(DEMO_REFERENCE[0]), np.exp(DEMO_REFERENCE[1]), DEMO_REFERENCE[2]
    moved = own * frontier.A * 1e13**-frontier.alpha / (ref_a * 1e13**-ref_alpha)
    assert frontier.term_at_centre("A")[3] == pytest.approx(percentile_interval(moved), rel=1e-4)


def test_a_band_of_predictions_is_each_points_interval():
    """``predict`` took arrays and ``predict_interval`` one point: a plot's band was a loop. An
    array now gives each point's interval, the frontier's moved by the laws' ratio as at one."""
    frontier = PowerLawFit.from_samples(
        DEMO_FRONTIER, demo_like_refits(alpha_sd=0.05), 20, 0.0, "t", DEMO_REFERENCE
    )
    c = np.logspace(12, 16, 5)
    lo, hi = frontier.predict_interval(c)
    assert lo.shape == hi.shape == (5,)
    each = [frontier.predict_interval(x) for x in c]
    assert np.column_stack([lo, hi]) == pytest.approx(np.array(each), rel=1e-4)
    law = ChinchillaFit(**TRUE, n_points=0, objective=0.0, samples=traded_off_refits())
    n, d = np.array([1e8, 1e9]), np.array([[1e9], [1e10], [1e11]])
    lo, hi = law.predict_interval(n, d)
    assert lo.shape == hi.shape == (3, 2)
    each = [[law.predict_interval(n[j], d[i, 0]) for j in range(2)] for i in range(3)]
    assert np.stack([lo, hi], axis=-1) == pytest.approx(np.array(each), rel=1e-4)
    bare_lo, bare_hi = ChinchillaFit(**TRUE, n_points=0, objective=0.0).predict_interval(n, 20 * n)
    assert bare_lo.shape == (2,) and np.isnan(bare_lo).all() and np.isnan(bare_hi).all()


def test_predict_loss_refuses_a_compute_budget_that_is_not_6_n_d():
    """N 7e9, D 140e9 and C 1e18 predicted at C = 5.88e21 "given N and D", the C dropped."""
    fit = ChinchillaFit(**TRUE, n_points=0, objective=0.0)
    with pytest.raises(AnalysisError) as err:
        predict_loss(fit, N=7e9, D=140e9, C=1e18)
    assert str(err.value) == (
        "predict_loss: N=7e+09, D=1.4e+11 and C=1e+18 disagree (6 N D = 5.88e+21); give two of "
        "them, or a C equal to 6 N D"
    )
    agreeing = predict_loss(fit, N=7e9, D=140e9, C=5.88e21 * (1 + 1e-9))
    assert agreeing.loss == pytest.approx(chinchilla_loss(7e9, 140e9), rel=1e-5)


def test_a_prediction_carries_its_fits_bootstrap_interval():
    """--target-params printed a loss with no interval although the fit had a bootstrap."""
    rng = np.random.default_rng(0)
    samples = {k: np.full(40, float(v)) * rng.uniform(0.98, 1.02, 40) for k, v in TRUE.items()}
    fit = ChinchillaFit(**TRUE, n_points=0, objective=0.0, samples=samples, n_bootstrap=40)
    pred = predict_loss(fit, N=1e9, C=6e19)
    lo, hi = fit.predict_interval(1e9, 1e10)
    assert pred.interval == (lo, hi) and lo < pred.loss < hi
    assert str(pred).startswith(f"L = {pred.loss:.4f} (95% {lo:.4f} .. {hi:.4f}) at N=1e+09")
    bare = predict_loss(ChinchillaFit(**TRUE, n_points=0, objective=0.0), N=1e9, C=6e19)
    assert str(bare) == f"L = {bare.loss:.4f} at N=1e+09, D=1e+10, C=6e+19 (D = C / 6N)"


# -- LR sweeps -----------------------------------------------------------------------------------


def test_three_size_ladder_extrapolates_with_the_frontier(tmp_path: Path):
    """Holding out one of three sizes leaves two, too few for L(N, D): the frontier predicts."""
    from io import StringIO

    from rich.console import Console

    from trainer_core.analysis import report_experiment

    three = {k: LADDER_N[k] for k in ("s1", "s2", "s3")}
    text = StringIO()
    report = report_experiment(
        make_ladder(tmp_path, sizes=three), n_bootstrap=0, console=Console(file=text, width=200)
    )
    check = report.extrapolation
    assert report.chinchilla is not None and check.held_out_size == "s3"
    assert [p.law for p in check.predictions] == ["frontier L(C)"]
    assert check.skipped[0][0] == "L(N, D)" and ">= 3 model sizes" in check.skipped[0][1]
    assert "skipped held-out L(N, D): fit_chinchilla needs >= 3 model sizes" in text.getvalue()
    assert abs(check.predictions[0].rel_error) < 0.05


def test_one_size_gets_its_tables_and_no_fits(tmp_path):
    """A run dir (or a ladder with one size done): no target table of empty columns and no
    advice to train the smaller sizes longer, one line saying why."""
    from io import StringIO

    from rich.console import Console

    from trainer_core.analysis import report_experiment

    text = StringIO()
    root = make_ladder(tmp_path, sizes={"s1": LADDER_N["s1"]})
    report = report_experiment(root / "runs" / "s1", n_bootstrap=0, console=Console(file=text))
    assert report.skipped == [
        "scaling-law fits: annealed points of one size (s1); the fits need >= 2 sizes"
    ]
    assert "compute-optimal" not in text.getvalue() and report.chinchilla is None
    assert [p.name for p in report.plots] == ["loss_vs_compute.png", "loss_curves.png"]


def test_a_target_size_without_an_l_n_d_fit_says_why(tmp_path):
    """Two sizes fit no L(N, D): --target-params was dropped without a word."""
    from io import StringIO

    from rich.console import Console

    from trainer_core.analysis import report_experiment

    two = {k: LADDER_N[k] for k in ("s1", "s2")}
    root = make_ladder(tmp_path, sizes=two)
    console = Console(file=StringIO(), width=200)
    report = report_experiment(root, target_params=1e9, n_bootstrap=0, console=console)
    assert report.chinchilla is None and report.predictions == []
    assert "prediction at N=1e+09: it needs the L(N, D) fit" in report.skipped


def test_a_target_below_the_ladder_says_it_is_extrapolated_back(tmp_path):
    """--target-flops below every annealed point printed N_opt and a loss as at any target."""
    from io import StringIO

    from rich.console import Console

    from trainer_core.analysis import report_experiment

    root = make_ladder(tmp_path)
    console = Console(file=StringIO(), width=200)
    report = report_experiment(root, target_flops=1.0, n_bootstrap=0, console=console)
    least = report.results.fit_points()["flops"].min()
    assert (
        f"the target 1 FLOPs is below the ladder's least annealed point ({least:.3g}): every "
        "column is extrapolated back, past the smallest runs"
    ) in report.target.footer()
    report = report_experiment(root, n_bootstrap=0, console=console)
    assert not [n for n in report.target.footer() if "extrapolated back" in n]


def test_a_target_size_is_trained_on_the_target_compute_when_both_are_given(tmp_path):
    """--target-params 1e6 --target-flops 1e14 predicted at 1.05e15 FLOPs (the compute-optimal
    D for N), 10x the budget named, with no interval although the fit had a bootstrap."""
    from io import StringIO

    from rich.console import Console

    from trainer_core.analysis import report_experiment

    root = make_ladder(tmp_path)
    text = StringIO()
    report = report_experiment(
        root,
        target_params=1e6,
        target_flops=1e14,
        n_bootstrap=8,
        console=Console(file=text, width=300),
    )
    [pred] = report.predictions
    assert pytest.approx((1e6, 1e14 / 6e6, 1e14)) == (pred.N, pred.D, pred.C)
    assert pred.how == "D = C / 6N"
    assert pred.interval == report.chinchilla.predict_interval(1e6, 1e14 / 6e6)
    lo, hi = pred.interval
    line = f"prediction: L = {pred.loss:.4f} (95% {lo:.4f} .. {hi:.4f}) at N=1e+06, D=1.67e+07"
    assert line in text.getvalue()
