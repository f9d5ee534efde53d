"""Known answers for the compute-optimal analysis: points drawn from Hoffmann et al.'s L(N, D)."""

from __future__ import annotations

import itertools
import json
import math
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from drawn import close, line
from matplotlib.backends.backend_agg import FigureCanvasAgg
from scripts import load_script

from trainer_core.analysis import (
    AnalysisError,
    ChinchillaFit,
    PowerLawFit,
    chinchilla_from_points,
    extrapolation_check,
    fit_chinchilla,
    fit_flags,
    fit_frontier,
    fit_isoflop,
    fit_loss_vs_compute,
    frontier_points,
    isoflop_flags,
    isoflop_unresolved,
    plot_isoflops,
    unresolved,
)
from trainer_core.analysis.bootstrap import residual_resamples
from trainer_core.analysis.isoflop import IsoFLOPFit
from trainer_core.analysis.plots_scaling import MAX_CURVES, isoflops_figure
from trainer_core.analysis.synthetic import CHINCHILLA, SyntheticLadder

LAW = CHINCHILLA
ALPHA_C = LAW.alpha * LAW.beta / (LAW.alpha + LAW.beta)
"""The exponent of the law's own frontier: L*(C) = E + K C^-alpha_C exactly."""


def law_frontier(c: np.ndarray) -> np.ndarray:
    """LAW at the compute-optimal N, D of each budget: its own frontier L*(C)."""
    return np.asarray(LAW.predict(*LAW.compute_optimal(c)))


@pytest.fixture(scope="module")
def noisy() -> pd.DataFrame:
    return SyntheticLadder(noise=0.005).points(seed=1)


def test_chinchilla_frontier_is_a_power_law_in_compute():
    c = np.logspace(18, 24, 7)
    n_opt, d_opt = LAW.compute_optimal(c)
    assert np.allclose(6 * n_opt * d_opt, c)
    k = (law_frontier(c) - LAW.E) * c**ALPHA_C
    assert np.allclose(k, k[0], rtol=1e-9)


def test_frontier_fit_matches_closed_form(noisy: pd.DataFrame):
    fit = fit_frontier(noisy, n_bootstrap=0)
    front = frontier_points(noisy)
    c = front["flops"].to_numpy()
    truth = law_frontier(c)
    assert np.max(np.abs(fit.predict(c) / truth - 1)) < 0.005
    assert fit.alpha == pytest.approx(ALPHA_C, abs=0.005)
    assert abs(fit.E / LAW.E - 1) < 0.03
    # The envelope never lies below the true frontier by more than the noise.
    assert np.all(front["eval_loss"] / truth > 1 - 3 * 0.005)


def test_frontier_beats_a_fit_to_every_point(noisy: pd.DataFrame):
    """Over- and under-trained points sit above the frontier: fitted to all of them, L(C) is off."""
    every = fit_loss_vs_compute(noisy["flops"], noisy["eval_loss"], n_bootstrap=0)
    front = fit_frontier(noisy, n_bootstrap=0)
    c = np.logspace(np.log10(noisy["flops"].min()) + 1, np.log10(noisy["flops"].max()) + 1, 20)
    truth = law_frontier(c)
    err_every = np.max(np.abs(every.predict(c) / truth - 1))
    err_front = np.max(np.abs(front.predict(c) / truth - 1))
    assert err_front < 0.01 < err_every


def test_frontier_ends_drop_single_size_budgets():
    pts = SyntheticLadder(noise=0.0, n_sizes=4).points()
    front = frontier_points(pts)
    by_size = pts.groupby("size")["flops"]
    assert front["flops"].min() >= by_size.min()["s1"] * (1 - 1e-9)
    assert front["flops"].max() <= by_size.max()["s2"] * (1 + 1e-9)
    whole = frontier_points(pts, trim_ends=False)
    assert whole["flops"].min() < front["flops"].min() and len(whole) > len(front)


def test_isoflop_recovers_compute_optimal_exponent(noisy: pd.DataFrame, tmp_path: Path):
    fit = fit_isoflop(noisy, n_bootstrap=40, seed=0)
    assert fit.a == pytest.approx(LAW.a, abs=0.03)
    assert fit.b == pytest.approx(1 - fit.a)
    lo, hi = fit.ci["a"]
    assert lo < fit.a < hi and hi - lo < 0.2
    n_opt, d_opt = fit.compute_optimal(1e21)
    assert 6 * n_opt * d_opt == pytest.approx(1e21)
    assert n_opt == pytest.approx(LAW.compute_optimal(1e21)[0], rel=0.3)
    for p in fit.parabolas:
        assert len(p.N) >= 3
    assert isoflop_flags(fit) == []
    png = plot_isoflops(fit, LAW, tmp_path / "iso.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_isoflop_plot_draws_each_budgets_parabola_through_its_points(noisy: pd.DataFrame):
    """Left: every used budget (here all, more than a legend names: a colour bar of C), each its
    points, its parabola in ln N through them and the vertex starred on it. Right: every
    budget's N_opt and both approaches' N_opt(C), no band without a bootstrap."""
    fit = fit_isoflop(noisy, n_bootstrap=0)
    left, right, colour_bar = isoflops_figure(fit, LAW).axes
    assert (left.get_xscale(), right.get_xscale(), right.get_yscale()) == ("log",) * 3
    shown = fit.parabolas
    assert all(p.valid for p in shown) and len(shown) == len(left.lines) > MAX_CURVES
    assert left.get_legend() is None and colour_bar.get_ylabel() == "compute budget C"
    scatters = [c.get_offsets() for c in left.collections]
    for p, curve in zip(shown, left.lines, strict=True):
        assert curve.get_label() == f"C = {p.flops:.2g}"
        x, y = curve.get_xdata(), curve.get_ydata()
        assert x.min() < p.N.min() and x.max() > p.N.max()
        assert close(y, np.polyval(p.coef, np.log(x)))
        assert sum(close(xy, np.column_stack([p.N, p.loss])) for xy in scatters) == 1
        assert p.valid and sum(close(xy, [[p.n_opt, p.loss_opt]]) for xy in scatters) == 1
        # the star sits on the drawn curve, at its lowest point
        assert y.min() >= p.loss_opt * (1 - 1e-5)
        assert close(np.polyval(p.coef, np.log(p.n_opt)), p.loss_opt)
    ok = [p for p in fit.parabolas if p.valid]
    (minima,) = right.collections
    assert close(minima.get_offsets(), [[p.flops, p.n_opt] for p in ok])
    two, three = right.lines
    assert two.get_label().startswith("approach 2")
    assert close(two.get_ydata(), [fit.compute_optimal(c)[0] for c in two.get_xdata()])
    assert three.get_label().startswith("approach 3")
    assert close(three.get_ydata(), LAW.compute_optimal(three.get_xdata())[0])


@pytest.fixture(scope="module")
def decade() -> IsoFLOPFit:
    """Four sizes spanning a decade of N (20K..160K, as the demo's 22K..222K): 18 budgets, 8
    with the minimum inside the sizes."""
    ladder = SyntheticLadder(smallest=2e4, n_sizes=4, multiples=(0.125, 0.25, 0.5, 1, 2, 4, 8, 16))
    return fit_isoflop(ladder.points(seed=1), n_bootstrap=0)


def test_isoflop_plot_draws_every_used_budget_and_says_what_it_leaves_out(decade: IsoFLOPFit):
    """The left panel drew every ceil(n/8)-th budget (on the demo 3 of its 7 used ones, beside
    the right panel's 7 minima), saying nothing: now every used one, the unused thinned to fill
    MAX_CURVES, and the title counts those left out."""
    used = [p for p in decade.parabolas if p.valid]
    unused = len(decade.parabolas) - len(used)
    assert (len(used), unused) == (8, 10)
    left = isoflops_figure(decade, None).axes[0]
    solid = [ln for ln in left.lines if ln.get_linestyle() == "-"]
    assert [ln.get_label() for ln in solid] == [f"C = {p.flops:.2g}" for p in used]
    for p, curve in zip(used, solid, strict=True):
        assert close(curve.get_ydata(), np.polyval(p.coef, np.log(curve.get_xdata())))
    dotted = [ln for ln in left.lines if ln.get_linestyle() == ":"]
    assert len(dotted) == MAX_CURVES - len(used)
    assert left.get_title().endswith(
        f"every used budget; {unused - len(dotted)} of the {unused} unused left out"
    )
    legend = [t.get_text() for t in left.get_legend().get_texts()]
    assert legend == [ln.get_label() for ln in left.lines], "every curve named, C ascending"


def test_isoflop_plot_draws_approach_2s_bootstrap_band(decade: IsoFLOPFit):
    """The table gives approach 2's N_opt an interval; the plot drew its line alone. The band is
    the fit's own interval at each C, of the resamples that gave a slope (the label says so)."""
    rng = np.random.default_rng(0)
    a = decade.a + 0.05 * rng.standard_normal(40)
    a[:4] = np.nan  # too few budgets with an inside minimum: no slope
    log_k = decade.log_k - (a - decade.a) * np.log(1e12)
    samples = {"a": a, "b": 1 - a, "log_k": log_k}
    fit = replace(decade, samples=samples, n_bootstrap=40, n_failed=4)
    right = isoflops_figure(fit, None).axes[1]
    (band,) = [c for c in right.collections if c.get_label().startswith("approach 2: 95%")]
    assert band.get_label().endswith("bootstrap band (36 of 40 bootstrap resamples gave a slope)")
    corners = band.get_paths()[0].vertices
    x, _ = line(right, "approach 2: N_opt")
    for c in x:
        for n in fit.optimal_intervals(c)["N"]:
            assert any(close(v, [c, n]) for v in corners), (c, n)


def test_isoflop_n_axis_labels_do_not_run_together(decade: IsoFLOPFit):
    """N spanning about a decade has one labelled decade, so matplotlib labels minor ticks too:
    '3x10^4' and '4x10^4' overlapped on the demo. Each label now clear of the next."""
    fig = isoflops_figure(decade, None)
    FigureCanvasAgg(fig).draw()
    left = fig.axes[0]
    x0, x1 = left.bbox.x0, left.bbox.x1
    boxes = [t.get_window_extent() for t in left.get_xticklabels(which="both") if t.get_text()]
    boxes = sorted((b for b in boxes if x0 <= (b.x0 + b.x1) / 2 <= x1), key=lambda b: b.x0)
    assert len(boxes) >= 3, "N is read off the axis"
    assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes)), [b.x0 for b in boxes]


def test_approach_2_gets_an_interval_around_its_own_estimate():
    """Truth with an N-D interaction L(N, D) can't express: approach 2's a (0.506) disagrees with
    approach 3's (0.440). Resampled around approach 3's fit, its interval sat there (0.388 ..
    0.503, leaving out its own estimate and hiding the disagreement). The frontier's interval
    stays approach 3's and says so when its estimate falls outside it."""
    from trainer_core.analysis.load import analysis_flops

    def law(n, d):
        return LAW.E + LAW.A / n**LAW.alpha + LAW.B / d**LAW.beta * (d / (20 * n)) ** 0.06

    rng = np.random.default_rng(5)
    rows = []
    for i, n in enumerate(1e7 * 2.0 ** np.arange(7)):
        for m in (0.125, 0.25, 0.5, 1, 2, 4, 8):
            d = 20 * n * m
            loss = law(n, d) * np.exp(0.005 * rng.standard_normal())
            rows.append(
                {
                    "size": f"s{i}",
                    "N": n,
                    "tokens": d,
                    "flops": analysis_flops(n, d),
                    "eval_loss": loss,
                }
            )
    pts = pd.DataFrame(rows)
    chin = fit_chinchilla(pts["N"], pts["tokens"], pts["eval_loss"], 0, groups=pts["size"])
    iso = fit_isoflop(pts, 60, 5, smoother=chin)
    lo, hi = iso.ci["a"]
    assert lo < iso.a < hi and chin.a < lo
    front = fit_frontier(pts, 60, 5, smoother=chin)
    lo, hi = front.ci["alpha"]
    assert lo < front.alpha < hi
    assert iso.centred and not [n for n in isoflop_unresolved(iso) if "not centred" in n]


def test_refits_around_another_law_are_moved_onto_the_estimate():
    """The frontier's resamples spread around the frontier of L(N, D), which the envelope need
    not follow: on the demo every printed estimate, the answer's loss too, sat outside its own
    interval. Parameters are moved by the difference, predictions by the two laws' ratio (moved
    parameters would break the trade-off of E, A and alpha)."""
    theta = np.array([np.log(1.0), np.log(100.0), 0.30])
    reference = np.array([np.log(1.2), np.log(80.0), 0.25])
    rng = np.random.default_rng(0)
    refits = reference + 0.01 * rng.standard_normal((400, 3))
    around = PowerLawFit.from_samples(theta, refits, 10, 0.0, "t")
    moved = PowerLawFit.from_samples(theta, refits, 10, 0.0, "t", reference)
    assert not around.ci["alpha"][0] < 0.30 < around.ci["alpha"][1]
    for name, value in moved.params().items():
        lo, hi = moved.ci[name]
        assert lo < value < hi, name
    C = 1e12
    lo, hi = moved.predict_interval(C)
    assert lo < moved.predict(C) < hi
    # the reference law's own refit predictions, each scaled by estimate / reference at C
    law = PowerLawFit(1.2, 80.0, 0.25, n_points=1, objective=0.0)
    scale = moved.predict(C) / law.predict(C)
    own = np.exp(refits[:, 0]) + np.exp(refits[:, 1]) * C ** -refits[:, 2]
    assert (lo, hi) == pytest.approx(np.percentile(own * scale, [2.5, 97.5]), rel=1e-4)
    assert around.predict_interval(C) == pytest.approx(np.percentile(own, [2.5, 97.5]), rel=1e-4)
    # kept as refitted, beside the law they spread around: no shift to divide back out
    assert np.array_equal(moved.samples["alpha"], refits[:, 2])
    assert moved.reference == pytest.approx((1.2, 80.0, 0.25)) and around.reference is None


def test_frontier_predictions_from_unmoved_refits_match_the_moved_ones():
    """The refits used to be stored moved onto the estimate (log E and log A shifted, alpha
    shifted) and moved back on every prediction; kept as refitted, with their reference, they
    give the moved version's predictions. Both sides are computed here from the same refits, so
    only the order of float operations differs between them."""
    ladder = SyntheticLadder(n_sizes=4, size_noise=0.01, multiples=(0.25, 0.5, 1, 2, 4))
    pts = ladder.points(seed=1)
    fit = fit_frontier(pts, n_bootstrap=6, seed=0, smoother=replace(LAW, n_points=len(pts)))
    assert fit.reference is not None and fit.n_bootstrap == 6
    e_ref, a_ref, alpha_ref = fit.reference
    s = fit.samples
    shift = (math.log(fit.E / e_ref), math.log(fit.A / a_ref), fit.alpha - alpha_ref)
    moved = (s["E"] * math.exp(shift[0]), s["A"] * math.exp(shift[1]), s["alpha"] + shift[2])
    for c in (1e20, 1e22):
        # the moved version's predict_samples, as it was written
        refits = moved[0] / math.exp(shift[0]) + moved[1] / math.exp(shift[1]) * c ** (
            shift[2] - moved[2]
        )
        ref = fit.E / math.exp(shift[0]) + fit.A / math.exp(shift[1]) * c ** (shift[2] - fit.alpha)
        old = refits * fit.predict(c) / ref
        assert fit.predict_samples(c) == pytest.approx(old, rel=1e-5)
    # alpha's refits are scaled onto the estimate, no longer shifted (test_fits.py)
    scaled = np.percentile(s["alpha"] * fit.alpha / alpha_ref, [2.5, 97.5])
    assert fit.ci["alpha"] == pytest.approx(tuple(scaled), rel=1e-5)
    assert fit.ci["alpha"][0] > 0


def test_a_law_through_as_many_points_as_parameters_gets_no_intervals():
    """One annealed point per size (a cosine ladder) of 5 sizes: L(N, D) passes through all 5,
    the residuals are zero, and every refit repeated the fit: E 0.8394 (95% CI 0.8394 ..
    0.8394), the target's N_opt and loss with intervals of zero width."""
    n = 1e7 * 2.0 ** np.arange(5)
    d = 20 * n * np.array([1.0, 4.0, 2.0, 8.0, 3.0])
    loss = LAW.predict(n, d) * np.exp(0.01 * np.array([1, -1, 0.5, -0.5, 0.2]))
    fit = fit_chinchilla(n, d, loss, n_bootstrap=20)
    assert fit.n_bootstrap == 0 and all(np.isnan(fit.ci["E"]))
    why = (
        "5 points for 5 parameters: the law passes through every one, so there is no noise to "
        "redraw: no 95% intervals (give each size more annealed points, e.g. WSD-S decays, or "
        "add sizes)"
    )
    assert fit.no_intervals == why and unresolved(fit, float(loss.min())) == [why]
    power = fit_loss_vs_compute([1e18, 1e19, 1e20], [3.0, 2.5, 2.2], n_bootstrap=20)
    assert power.no_intervals == why.replace("5 points for 5", "3 points for 3")
    more = fit_chinchilla(np.append(n, n[0]), np.append(d, 2 * d[0]), np.append(loss, 3.0), 20)
    assert more.n_bootstrap == 20


def test_a_ladder_with_one_tokens_per_parameter_ratio_is_refused_by_approach_3():
    """One cosine run per size at 80 tokens a parameter: log D = log N + const, so the N and D
    terms trade freely (it fitted beta 5-10, B 1e88, N_opt 60x the truth, with intervals)."""
    n = 1e7 * 2.0 ** np.arange(6)
    d = 80 * n * (1 + np.array([0.0, 2e-3, 1e-3, 3e-4, 1e-4, 5e-4]))  # steps rounded up
    with pytest.raises(AnalysisError, match=r"about the same tokens per parameter \(D/N = 80 "):
        fit_chinchilla(n, d, LAW.predict(n, d))


def test_isoflop_resamples_without_a_slope_are_counted_and_flagged():
    """Resamples with too few interior minima give no slope: they were dropped from the interval
    while the report still said "100 bootstrap resamples"."""
    ladder = SyntheticLadder(
        n_sizes=4, noise=0.005, size_noise=0.01, multiples=(0.25, 0.5, 1, 2, 4, 8, 16)
    )
    pts = ladder.points(1)
    chin = fit_chinchilla(pts["N"], pts["tokens"], pts["eval_loss"], 0, groups=pts["size"])
    fit = fit_isoflop(pts, 100, 1, smoother=chin)
    assert 5 < fit.n_failed < 50
    assert f"{100 - fit.n_failed} of 100 bootstrap resamples gave a slope" in str(fit)
    [note] = [n for n in isoflop_unresolved(fit) if "gave no slope" in n]
    assert note.startswith(f"a: {fit.n_failed} of 100 resamples had fewer than 3 budgets")


def test_isoflop_without_an_interior_minimum_says_so():
    """Every size heavily over-trained: each budget's optimum is larger than the sizes there."""
    pts = SyntheticLadder(noise=0.0, multiples=(16, 32, 64, 128, 256, 512, 1024)).points()
    from trainer_core.analysis import AnalysisError

    with pytest.raises(AnalysisError, match=r"isoFLOP: \d+ budgets covered by 3 sizes, 0 with"):
        fit_isoflop(pts, n_bootstrap=0)


def test_held_out_size_predicted_by_both_laws_with_intervals(noisy: pd.DataFrame):
    check = extrapolation_check(noisy, n_bootstrap=30)
    assert check.held_out_size == "s6" and check.skipped == []
    assert [p.law for p in check.predictions] == ["L(N, D)", "frontier L(C)"]
    final = noisy[noisy["size"] == "s6"].sort_values("tokens").iloc[-1]
    assert check.actual == final["eval_loss"] and check.flops == final["flops"]
    for p in check.predictions:
        lo, hi = p.interval
        assert lo < p.predicted < hi and hi - lo < 0.1
        assert abs(p.rel_error) < 0.02
        assert p.flags == []
    text = str(check)
    assert "L(N, D) at N=6.4e+08" in text and "frontier L(C) at C=" in text and "95%" in text
    # The frontier claims the best loss at a compute: it is scored at s6's point nearest the
    # compute-optimal split (Chinchilla's law puts it at 20-40 tokens a parameter there), not at
    # its last (160: off the frontier, above L(C) by design; scored there it read as an error).
    held = noisy[noisy["size"] == "s6"].set_index("flops")["tokens"] / 6.4e8
    frontier = check.prediction("frontier L(C)")
    assert held[frontier.flops] in (20, 40) and frontier.notes == []
    assert check.prediction("L(N, D)").flops == final["flops"]
    long = noisy[(noisy["size"] != "s6") | (noisy["tokens"] >= 160 * noisy["N"])]  # s6: 160 only
    frontier = extrapolation_check(long, n_bootstrap=0).prediction("frontier L(C)")
    [off] = frontier.notes
    assert off.startswith("the held-out point nearest the frontier has 160 tokens a parameter")


def test_degenerate_fits_are_flagged():
    healthy = ChinchillaFit(**LAW.params(), n_points=9, objective=0)
    assert fit_flags(healthy, min_loss=2.0) == []
    broken = ChinchillaFit(
        E=8.2e-85,
        A=1.0,
        B=1.0,
        alpha=4.0,
        beta=0.01,
        n_points=9,
        objective=0,
        ci={"E": (0.0, 1.0), "A": (1.7e-18, math.inf)},
        n_bootstrap=10,
    )
    flags = fit_flags(broken, min_loss=2.0)
    assert any("E = 8.2e-85 is zero" in f for f in flags)
    assert any("alpha = 4 is outside 0.05 .. 2" in f for f in flags)
    assert any("beta = 0.01 is outside" in f for f in flags)
    assert any("non-finite 95% CI of A" in f for f in flags)
    high_e = PowerLawFit(E=3.0, A=10.0, alpha=0.2, n_points=5, objective=0)
    assert fit_flags(high_e, min_loss=2.5) == ["E = 3 is not below the smallest observed loss 2.5"]


def test_what_the_data_leave_open_is_said_beside_the_fit(noisy: pd.DataFrame):
    """A well-posed fit (seven sizes over 100x in N) leaves nothing open; a ladder of few sizes
    leaves E reaching zero and A trading off with alpha, and approach 2 without a split."""
    fitted = ChinchillaFit(
        **LAW.params(),
        n_points=9,
        objective=0,
        ci={"E": (1.6, 1.8), "A": (300.0, 500.0), "B": (350.0, 470.0)},
        n_bootstrap=200,
    )
    assert unresolved(fitted, min_loss=2.0) == []
    few_sizes = ChinchillaFit(
        **LAW.params(),
        n_points=20,
        objective=0,
        ci={"E": (3.4e-12, 0.87), "A": (3.29, 5.59e5), "B": (18.9, 4281.0)},
        n_bootstrap=200,
    )
    notes = unresolved(few_sizes, min_loss=1.1)
    assert notes[0].startswith("E: 95% CI 3.4e-12 .. 0.87 reaches zero")
    assert notes[1].startswith("A: 95% CI 3.29 .. 5.59e+05 spans 5.2 orders of magnitude")
    assert notes[2].startswith("B: 95% CI 18.9 .. 4.28e+03 spans 2.4 orders")
    assert len(notes) == 3
    iso = fit_isoflop(noisy, n_bootstrap=20, seed=0)
    assert isoflop_unresolved(iso) == []
    iso.ci["a"] = (-0.42, 1.85)
    (note,) = isoflop_unresolved(iso)
    assert "covers every split of compute" in note and "approach 3" in note


def test_residual_resamples_keep_the_design_and_share_size_offsets():
    rng = np.random.default_rng(0)
    fitted = np.log(np.linspace(3, 4, 6))
    groups = np.array(["a", "a", "a", "b", "b", "b"])
    # Residuals constant within a size: a pure size offset, no scatter.
    observed = fitted + np.array([0.01, 0.01, 0.01, -0.02, -0.02, -0.02])
    draws = residual_resamples(observed, fitted, groups, 0, 200, rng)
    shift = draws - fitted
    assert np.allclose(shift[:, :3], shift[:, :1]) and np.allclose(shift[:, 3:], shift[:, 3:4])
    # Centred on their mean (-0.005): resampled offsets do not shift the resamples as a whole.
    assert set(np.round(np.unique(shift), 6)) == {0.015, -0.015}
    # Without groups, every point draws its own residual.
    draws = residual_resamples(observed, fitted, np.arange(6), 0, 200, rng)
    assert not np.allclose(draws[:, 0], draws[:, 1])
    # One point per size (a cosine ladder): all 5 parameters of L(N, D) came out of the 8
    # offsets, not the 3 that vary between sizes, so they are inflated by sqrt(8 / 3).
    resid = np.array([1, -1, 2, -2, 1, -1, 2, -2]) * 0.01
    draws = residual_resamples(resid, np.zeros(8), np.arange(8), 5, 10, rng, group_params=3)
    assert set(np.round(np.abs(draws.ravel()) / np.sqrt(8 / 3), 6)) <= {0.01, 0.02}


def _write_ladder(root: Path, points: pd.DataFrame) -> Path:
    """A ladder experiment dir whose annealed checkpoint evals are ``points``."""
    for size, g in points.groupby("size"):
        run = root / "runs" / str(size)
        run.mkdir(parents=True)
        n = float(g["N"].iloc[0])
        steps = len(g)
        record = {
            "name": size,
            "size": size,
            "num_params": n,
            "flops_per_token": 6 * n,
            "lr": 1e-3,
            "global_batch_tokens": 1,
            "seq_len": 128,
            "total_steps": steps,
            "status": "finished",
            "last_step": steps,
        }
        (run / "run.json").write_text(json.dumps(record))
        for step, row in enumerate(g.sort_values("tokens").itertuples(index=False), start=1):
            point = {"step": step, "tokens": row.tokens, "eval/loss": row.eval_loss, "lr": 1e-4}
            (run / f"metrics_step{step}.json").write_text(json.dumps(point))
    return root


@pytest.mark.slow
def test_analyze_prints_approaches_side_by_side_and_both_held_out_predictions(
    run_script, noisy: pd.DataFrame, tmp_path: Path
):
    exp = _write_ladder(tmp_path / "exp", noisy)
    args = (str(exp), "--target-flops", "1e21", "--bootstrap", "10")
    code, text, err = run_script("workflows/analyze.py", *args)
    assert code == 0, err
    assert "compute-optimal at C = 1e+21 FLOPs" in text
    assert "approach 2 (isoFLOP)" in text and "approach 3 (L(N, D))" in text
    a_row = next(line for line in text.splitlines() if "a: N_opt ~ C^a" in line)
    a2, a3 = (float(cell.split()[0]) for cell in a_row.split("│")[2:4])
    assert a2 == pytest.approx(LAW.a, abs=0.03) and a3 == pytest.approx(LAW.a, abs=0.03)
    held = text[text.index("held out: s6") :]
    assert "│ L(N, D)" in held and "│ frontier L(C)" in held
    assert "DEGENERATE" not in text and "UNRESOLVED" not in text
    assert (exp / "analysis" / "isoflops.png").is_file()
    assert (exp / "analysis" / "loss_vs_compute.png").is_file()


def test_chinchillas_points_refit_to_epochs_published_law():
    """The check no synthetic test can fake: Hoffmann et al.'s approach-3 points, as Epoch AI
    extracted them (benchmarks/data/chinchilla), fitted the way Besiroglu et al. 2024 fitted them
    (D = C / 6N, the five highest losses out), give their published law: E 1.817, A 482.0,
    B 2085.4, alpha 0.3478, beta 0.3658 (benchmarks/chinchilla_refit.py prints the comparison)."""
    refit = load_script("benchmarks/chinchilla_refit.py")
    points = refit.load_points()
    fit = fit_chinchilla(points["N"], points["D"], points["loss"], 0)
    published = {name: value for name, (value, _, _) in refit.EPOCH.items()}
    assert len(points) == 240
    assert published == {"E": 1.817, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}
    assert pytest.approx(published["E"], abs=0.005) == fit.E
    assert fit.alpha == pytest.approx(published["alpha"], abs=0.005)
    assert fit.beta == pytest.approx(published["beta"], abs=0.005)
    assert pytest.approx(published["A"], rel=0.05) == fit.A
    assert pytest.approx(published["B"], rel=0.05) == fit.B


def test_chinchillas_by_size_intervals_group_points_by_n_not_by_the_loss_colour():
    """The figure's colour is its loss scale (one colour per loss, some colours spanning 17x in
    N), so the by-size bootstrap ties together the points of one N: 43 sizes, each one N."""
    refit = load_script("benchmarks/chinchilla_refit.py")
    points = refit.load_points()
    colour_spans = points.groupby("colour")["N"].agg(lambda n: n.max() / n.min())
    assert points.groupby("colour")["loss"].nunique().max() == 1 and colour_spans.max() > 17
    sizes = refit.size_groups(points["N"])
    assert (points.groupby(sizes)["N"].agg(lambda n: n.max() / n.min()) < 1.0001).all()
    assert refit.refits(points, 0)["ours, by size"].n_sizes == sizes.nunique() == 43


def test_intervals_from_three_sizes_say_they_leave_out_the_noise_between_sizes():
    """E, A and alpha vary between sizes, so three sizes' offsets are absorbed whole and the
    resamples keep only the scatter: each fit, and a held-out check of a four-size ladder, says
    so; with a fourth size the note goes."""
    ladder = SyntheticLadder(n_sizes=4, multiples=(0.5, 1.0, 2.0, 4.0, 8.0), size_noise=0.02)
    points = ladder.points(seed=1)
    check = extrapolation_check(points, n_bootstrap=20)
    assert all(p.notes == [_three_sizes_note()] for p in check.predictions)
    three = points[points["N"] < points["N"].max()]
    chinchilla = chinchilla_from_points(three, n_bootstrap=20)
    assert _three_sizes_note() in unresolved(chinchilla, three["eval_loss"].min())
    front = fit_frontier(three, n_bootstrap=20, smoother=chinchilla)
    assert _three_sizes_note() in unresolved(front, three["eval_loss"].min())
    four = chinchilla_from_points(points, n_bootstrap=20)
    assert four.n_sizes == 4 and _three_sizes_note() not in unresolved(four, 1.0)


def _three_sizes_note() -> str:
    return (
        "95% intervals: 3 sizes leave the noise between sizes no degree of freedom, so the "
        "intervals are too narrow; a 4th size gives it one"
    )


def test_runs_of_one_size_count_once_in_an_isoflop_budget():
    """Two runs of one N (LR variants) counted as two sizes: a budget held 3 curves of 2
    distinct N, a parabola nothing pins down (and numpy's RankWarning, 22 times, on stdout)."""
    from trainer_core.analysis.isoflop import isoflop_parabolas

    rows = []
    for size, n, bump in (("a", 1e7, 1.0), ("b", 2e7, 1.0), ("b2", 2e7, 1.01), ("c", 4e7, 1.0)):
        for m in (0.25, 0.5, 1, 2, 4, 8):
            d = 20 * n * m
            loss = LAW.predict(n, d) * bump
            rows.append({"size": size, "N": n, "tokens": d, "flops": 6 * n * d, "eval_loss": loss})
    points = pd.DataFrame(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parabolas = isoflop_parabolas(points)
    assert parabolas and all(len(set(p.N)) == len(p.N) >= 3 for p in parabolas)


def test_a_held_out_interval_holds_the_noise_of_the_point_it_is_compared_with():
    """The interval beside a measured held-out loss was the law's alone, for its mean: on
    synthetic 5-size ladders one measured loss fell outside it 21% of the time (83% now, 88%
    for the law's truth: the rest is the law's own extrapolation)."""
    from trainer_core.analysis.predict import LAW_CHINCHILLA, extrapolation_check, measurement_noise

    pts = SyntheticLadder(n_sizes=5, size_noise=0.005).points(seed=3)
    check = extrapolation_check(pts, n_bootstrap=60, seed=3)
    (p,) = [p for p in check.predictions if p.law == LAW_CHINCHILLA]
    law = check.fits[LAW_CHINCHILLA]
    rest = pts[pts["N"] != pts["N"].max()]
    noise = measurement_noise(rest, law, 60, 4)
    samples = law.predict_samples(check.held_out_N, check.tokens)
    expected = np.percentile(samples * np.exp(noise), [2.5, 97.5])
    assert p.interval == pytest.approx(expected, rel=1e-4)
    lo, hi = law.predict_interval(check.held_out_N, check.tokens)
    assert p.interval[1] - p.interval[0] > hi - lo
    assert 0.002 < np.std(noise) < 0.05  # 0.5% a point and 0.5% a size, inflated


def test_sizes_with_one_annealed_point_each_still_have_a_frontier():
    """A cosine ladder anneals once per size, at its end: no budget of the grid fell on those
    points, the frontier was refused with advice to train the smaller sizes longer, and the
    held-out check went with it. Approach 2 says what it needs instead."""
    from trainer_core.analysis.isoflop import isoflop_parabolas

    n = 1e7 * 2.0 ** np.arange(6)
    d = 20 * n * np.array([8.0, 6.0, 4.0, 2.0, 1.5, 1.0])
    pts = pd.DataFrame(
        {
            "size": [f"s{i}" for i in range(6)],
            "N": n,
            "tokens": d,
            "flops": 6 * n * d,
            "eval_loss": LAW.predict(n, d),
        }
    )
    front = fit_frontier(pts, n_bootstrap=0)
    assert front.n_points == 4  # the envelope without its single-size ends
    # 5 such sizes: L(N, D) passes through all 5 points, leaving no noise to redraw around it;
    # the frontier printed intervals (alpha's starting at its estimate) beside "no intervals"
    five = fit_frontier(pts.iloc[:5], n_bootstrap=20)
    assert five.n_bootstrap == 0 and unresolved(five, 1.0)[0].startswith("3 points for 3 ")
    with pytest.raises(AnalysisError, match=r"isoFLOP: each size has one annealed point, so no"):
        isoflop_parabolas(pts)


def test_a_frontier_that_is_one_sizes_own_curve_is_refused():
    """Two sizes, one lowest wherever both were trained: the envelope of a 2-size demo ladder was
    its smaller size's at all 6 budgets, and the "frontier" printed as the answer was that size's
    learning curve carried 27x past its last point."""
    pts = SyntheticLadder(n_sizes=2, multiples=(1.0, 2.0, 4.0, 8.0, 16.0, 32.0), noise=0.0)
    points = pts.points()
    assert set(frontier_points(points)["size"]) == {"s1"}
    with pytest.raises(AnalysisError) as refused:
        fit_frontier(points, n_bootstrap=0)
    assert str(refused.value) == (
        "frontier: the envelope is s1's at all 11 of its compute budgets (no other size is "
        "lowest at any), so L(C) would be s1's own learning curve extrapolated, not a frontier; "
        "add sizes, or spread each size's annealed points over more compute "
        "(duration.chinchilla_multiple, duration.decay_points)"
    )


def test_a_two_size_frontier_says_why_it_has_no_intervals():
    """Its resamples are drawn around L(N, D), which 2 sizes can't fit: the fit printed
    "0 bootstrap resamples" and no word of why, beside asked-for 95% intervals elsewhere."""
    points = SyntheticLadder(n_sizes=2, noise=0.0).points()
    assert frontier_points(points)["size"].nunique() == 2
    fit = fit_frontier(points, n_bootstrap=20)
    assert fit.n_bootstrap == 0 and not fit.predict_samples(1e20).size
    assert unresolved(fit, float(points["eval_loss"].min())) == [
        "no 95% intervals: the bootstrap redraws the points' noise around an L(N, D) fit of the "
        "same points, and they have none (fit_chinchilla needs >= 3 model sizes and >= 2 token "
        "counts (got 2 and 8): E + A/N^alpha can't be pinned down otherwise)"
    ]
    # none asked for: nothing to explain
    assert unresolved(fit_frontier(points, n_bootstrap=0), 1.0) == []


def test_a_frontier_resampled_around_a_law_through_every_point_says_so_as_any_fit_does():
    """The smoother passing through every point had its own wording of the same reason and fix
    ("passes through all 5 points, so there is no noise to redraw"); now one line for both."""
    points = SyntheticLadder(n_sizes=4, multiples=(0.25, 0.5, 1, 2, 4)).points(seed=1)
    fit = fit_frontier(points, n_bootstrap=6, smoother=replace(LAW, n_points=5))
    assert fit.n_bootstrap == 0
    assert unresolved(fit, 1.0) == [
        "5 points for 5 parameters: L(N, D), which the resamples are drawn around, passes through "
        "every one, so there is no noise to redraw: no 95% intervals (give each size more "
        "annealed points, e.g. WSD-S decays, or add sizes)"
    ]
