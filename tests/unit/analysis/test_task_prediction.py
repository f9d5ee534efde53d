"""The two-step task prediction recovers a known task law, and its intervals hold the truth."""

from __future__ import annotations

import math

import numpy as np
import pytest
from drawn import bars, close, marker, scatter, through
from matplotlib.axes import Axes
from matplotlib.collections import Collection

from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.labels import compact
from trainer_core.analysis.ladder_table import read_ladder_table
from trainer_core.analysis.plots import COMPUTE_LABEL
from trainer_core.analysis.plots_tasks import task_prediction_figure
from trainer_core.analysis.synthetic_tasks import TaskTruth, task_ladder
from trainer_core.analysis.task_sigmoid import fit_sigmoid, sigmoid_flags
from trainer_core.analysis.tasks import (
    STEP1_COMPUTE,
    TaskPrediction,
    TaskReport,
    final_points,
    fit_task,
    predict_tasks,
    task_holdout_check,
)

TRUTH = TaskTruth()
TARGET = (7e9, 2e12)
BOOT = 30


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    path = tmp_path_factory.mktemp("tasks") / "ladder.csv"
    task_ladder(TRUTH, seed=1).to_csv(path, index=False)
    return read_ladder_table(path, loss=None)


@pytest.fixture(scope="module")
def law(points):
    return fit_task(points, "synth", TRUTH.chance, n_bootstrap=BOOT, ceiling=None)


def test_step1_recovers_the_task_loss_law(law):
    fit = law.step1
    assert fit.beta == pytest.approx(TRUTH.beta, rel=0.1)
    assert fit.alpha == pytest.approx(TRUTH.alpha, rel=0.3)
    for name in ("E", "alpha", "beta"):
        lo, hi = fit.ci[name]
        assert lo <= getattr(TRUTH, name) <= hi, name


def test_step2_recovers_the_sigmoid(law):
    fit = law.step2
    assert fit.ceiling == pytest.approx(TRUTH.ceiling, abs=0.03)
    assert fit.k == pytest.approx(TRUTH.k, rel=0.1)
    assert pytest.approx(TRUTH.L0, abs=0.03) == fit.L0
    for name in ("ceiling", "k", "L0"):
        lo, hi = fit.ci[name]
        assert lo <= getattr(TRUTH, name) <= hi, name


def test_prediction_at_a_far_target_holds_the_truth(law):
    n, d = TARGET
    pred = law.predict(n, d, "7B", float(TRUTH.loss(n, d)), float(TRUTH.acc(n, d)))
    assert pred.covers
    lo, hi = pred.loss_interval
    assert lo <= TRUTH.loss(n, d) <= hi
    assert abs(pred.acc_error) < 0.02
    line = str(pred)
    assert "synth" in line and "7B" in line and f"{pred.acc:.3f}" in line


def test_the_interval_carries_both_steps(law):
    """Chaining widens the accuracy interval beyond what either step alone gives it."""
    n, d = TARGET
    pred = law.predict(n, d)
    alone = np.array(law.step2.predict_samples(np.full(law.step2.n_bootstrap, pred.loss)))
    step2_width = np.subtract(*np.percentile(alone, [97.5, 2.5]))
    step1_lo, step1_hi = pred.loss_interval
    step1_width = abs(law.step2.predict(step1_lo) - law.step2.predict(step1_hi))
    width = pred.acc_interval[1] - pred.acc_interval[0]
    assert width > step2_width
    assert width > 0.5 * step1_width


def test_a_measured_score_is_held_to_the_fits_spread_plus_its_sampling_noise(law):
    """A score on 200 examples scatters by sqrt(p (1 - p) / 200) (0.024 at p = 0.86) by sampling
    alone: the band a measured score is held to takes that in, the fits' own interval does not
    (30 refits: the percentiles are rough, so the bound is one standard deviation each side)."""
    n, d = TARGET
    fits_only, measured_on_200 = law.predict(n, d), law.predict(n, d, examples=200)
    assert measured_on_200.acc == fits_only.acc
    width = measured_on_200.acc_interval[1] - measured_on_200.acc_interval[0]
    p = fits_only.acc
    assert width > 2 * math.sqrt(p * (1 - p) / 200)
    assert width > fits_only.acc_interval[1] - fits_only.acc_interval[0]
    report = TaskReport([measured_on_200])
    assert "score on 200 examples" in str(report)


def test_held_out_size_is_predicted_within_its_interval(points):
    report = task_holdout_check(points, {"synth": TRUTH.chance}, n_bootstrap=BOOT, ceiling=None)
    assert len(report.predictions) == 4  # the largest size's four runs
    assert {p.N for p in report.predictions} == {max(points["N"])}
    errors = [abs(p.acc_error) for p in report.predictions]
    assert max(errors) < 0.03
    assert sum(p.covers for p in report.predictions) >= 3
    assert "held out" in str(report)


def test_the_calibrated_accuracy_is_fitted_where_a_table_has_it(points):
    """A table whose sigmoid is in ``acc_pmi`` and whose raw ``acc`` sits at chance (as a small
    model's raw ranking can): step 2 fits the calibrated one and recovers the truth, and the
    held-out check compares with the calibrated measurement."""
    table = points.rename(columns={"synth/acc": "synth/acc_pmi"})
    table["synth/acc"] = TRUTH.chance
    law = fit_task(table, "synth", TRUTH.chance, n_bootstrap=BOOT, ceiling=None)
    assert law.accuracy == "acc_pmi"
    assert law.step2.k == pytest.approx(TRUTH.k, rel=0.1)
    assert "step 2 (acc_pmi)" in str(law)
    report = task_holdout_check(table, {"synth": TRUTH.chance}, n_bootstrap=BOOT, ceiling=None)
    held = final_points(table[table["N"] == table["N"].max()])
    assert sorted(p.measured_acc for p in report.predictions) == sorted(held["synth/acc_pmi"])
    assert max(abs(p.acc_error) for p in report.predictions) < 0.03
    assert all(p.row().startswith("synth            acc_pmi ") for p in report.predictions)
    raw = fit_task(table, "synth", TRUTH.chance, n_bootstrap=0, ceiling=None, accuracy="acc")
    assert raw.accuracy == "acc" and raw.predict(*TARGET).acc == pytest.approx(
        TRUTH.chance, abs=1e-3
    )


def test_a_miss_is_split_into_its_two_steps(law):
    """The steps' errors told apart, as Bhagia et al. report them: a measured task loss on the
    law with an accuracy 20 points above the sigmoid is a step-2 miss; a task loss 30% off with
    the accuracy on the sigmoid is a step-1 miss."""
    n, d = TARGET
    true_loss, true_acc = float(TRUTH.loss(n, d)), float(TRUTH.acc(n, d))
    step2 = law.predict(n, d, "far", true_loss, true_acc - 0.2, examples=200)
    assert step2.loss_error == pytest.approx(step2.loss / true_loss - 1)
    assert abs(step2.loss_error) < 0.02 and step2.step2_error == pytest.approx(0.2, abs=0.02)
    assert step2.acc_error == pytest.approx(0.2, abs=0.03) and not step2.covers
    text = str(TaskReport([step2]))
    assert f"{100 * step2.loss_error:+6.1f}%  {100 * step2.step2_error:+6.1f}" in text
    assert "MISS: synth at far: measured acc" in text and "step 2 carries it" in text
    assert "scores lower than the sizes" in text
    off = 1.3 * true_loss
    step1 = law.predict(n, d, "far", off, float(law.step2.predict(off)), examples=200)
    assert step1.step2_error == 0.0 and step1.loss_error == pytest.approx(1 / 1.3 - 1, abs=0.02)
    assert "step 1 carries it" in str(TaskReport([step1]))
    assert "MISS" not in str(TaskReport([law.predict(n, d, "far", true_loss, true_acc, 200)]))


def test_step1_against_compute(points):
    law = fit_task(points, "synth", TRUTH.chance, step1=STEP1_COMPUTE, n_bootstrap=10)
    n, d = 4e8, 8e9
    assert law.predict_loss(n, d) == pytest.approx(float(TRUTH.loss(n, d)), rel=0.05)


def test_default_ceiling_is_fixed_at_one():
    """A ladder that never sees the sigmoid bend over: the ceiling stays at 1, the floor (at
    chance here), k and L0 are recovered, and the ceiling gets no interval of its own."""
    truth = TaskTruth(ceiling=1.0)
    table = task_ladder(truth, seed=3, sizes=(2e7, 5e7, 1e8))
    fit = fit_sigmoid(table["synth/bpb"], table["synth/acc"], truth.chance, n_bootstrap=20)
    assert fit.ceiling == 1.0
    assert fit.floor == pytest.approx(truth.chance, abs=0.01)
    assert fit.k == pytest.approx(truth.k, rel=0.15)
    assert abs(fit.L0 - truth.L0) < 0.05
    assert "ceiling" not in fit.ci and set(fit.ci) == {"floor", "k", "L0"}
    assert np.all(fit.samples["ceiling"] == 1.0)
    pinned = fit_sigmoid(table["synth/bpb"], table["synth/acc"], 0.25, n_bootstrap=5, floor=0.25)
    assert pinned.floor == 0.25 and set(pinned.ci) == {"k", "L0"}


def test_a_floor_above_chance_is_recovered_and_a_chance_floor_misses_it():
    """A metric that plateaus above chance at high task loss (the demo's calibrated accuracy
    sits near 0.4 for every small model): the fitted floor finds the plateau and predicts the
    large models; a floor pinned at chance bends the sigmoid to reach it and misses."""
    truth = TaskTruth(ceiling=1.0, floor=0.4, k=4.0, L0=0.9)
    table = task_ladder(truth, seed=5)
    loss, acc = table["synth/bpb"], table["synth/acc"]
    fit = fit_sigmoid(loss, acc, truth.chance, n_bootstrap=30)
    lo, hi = fit.ci["floor"]
    assert fit.floor == pytest.approx(0.4, abs=0.02) and lo <= 0.4 <= hi
    far = float(truth.loss(*TARGET))
    assert fit.predict(far) == pytest.approx(float(truth.acc(*TARGET)), abs=0.01)
    at_chance = fit_sigmoid(loss, acc, truth.chance, n_bootstrap=0, floor=truth.chance)
    assert at_chance.rmse > 2 * fit.rmse
    with pytest.raises(AnalysisError, match=r"floor = 1.2 is not in 0 .. 1"):
        fit_sigmoid(loss, acc, truth.chance, floor=1.2)


def test_near_chance_points_flag_the_ceiling():
    """Small models that never leave chance say nothing of where the sigmoid rises or tops out."""
    rng = np.random.default_rng(0)
    loss = rng.uniform(2.0, 2.5, 60)
    acc = 0.25 + rng.normal(0, 0.005, 60)
    fit = fit_sigmoid(loss, acc, 0.25, n_bootstrap=10)
    flags = sigmoid_flags(fit, acc)
    assert any("ceiling" in f and "chance" in f for f in flags)


def test_a_plateau_above_chance_is_flagged_and_an_impossible_ceiling_refused():
    """Accuracies flat at 0.42 (chance 0.25) passed unflagged: the floor fitted at 0 and the
    prediction at a lower loss came with a confident interval."""
    rng = np.random.default_rng(0)
    loss = rng.uniform(1.0, 1.6, 40)
    acc = 0.42 + rng.normal(0, 0.01, 40)
    fit = fit_sigmoid(loss, acc, 0.25, n_bootstrap=10, ceiling=None)
    assert any(f.startswith("rise: every accuracy lies in") for f in sigmoid_flags(fit, acc))
    for bad in (0.1, 1.2):
        with pytest.raises(AnalysisError, match=f"ceiling = {bad} must lie above chance"):
            fit_sigmoid(loss, acc, 0.25, ceiling=bad)
    with pytest.raises(AnalysisError, match="ceiling = 0.3 must lie above chance .* and the floor"):
        fit_sigmoid(loss, acc, 0.25, ceiling=0.3, floor=0.6)


def test_a_rise_within_the_scores_sampling_noise_is_flagged():
    """Accuracies rising 0.40 -> 0.48 over the ladder on 100 examples each: two scores of one
    model differ by 0.138 1 time in 20, so the rise is noise as far as they show; on 10,000
    examples it is real."""
    loss = np.linspace(1.6, 1.0, 12)
    acc = np.linspace(0.40, 0.48, 12)
    fit = fit_sigmoid(loss, acc, 0.25, n_bootstrap=0)
    noisy = [f for f in sigmoid_flags(fit, acc, examples=100) if f.startswith("noise:")]
    assert noisy == [
        "noise: the accuracies span 0.4 .. 0.48, less than two scores on 100 examples differ by "
        "chance alone 1 time in 20 (0.138): the rise is not resolved, so the sigmoid's step is "
        "a guess (score more examples)"
    ]
    assert not [f for f in sigmoid_flags(fit, acc, examples=10_000) if f.startswith("noise:")]
    assert not [f for f in sigmoid_flags(fit, acc) if f.startswith("noise:")]


def test_a_resolved_sigmoid_has_no_step2_flags(law, points):
    assert sigmoid_flags(law.step2, points["synth/acc"].to_numpy()) == []


def test_report_lists_every_task_and_its_flags_once(points):
    report = predict_tasks(points, {"synth": TRUTH.chance}, *TARGET, at="7B", n_bootstrap=10)
    text = str(report)
    assert text.count("\nsynth ") == 1
    for flag in report.predictions[0].flags:
        assert text.count(flag) == 1


def test_missing_task_column_is_one_clear_error(points):
    with pytest.raises(AnalysisError, match=r"hellaswag/bpb"):
        fit_task(points, "hellaswag", 0.25)


def test_sigmoid_rejects_too_few_or_bad_points():
    with pytest.raises(AnalysisError, match="4"):
        fit_sigmoid([1.0, 2.0], [0.5, 0.3], 0.25)
    with pytest.raises(AnalysisError, match="finite"):
        fit_sigmoid([1.0, 2.0, math.nan, 3.0], [0.5, 0.3, 0.3, 0.2], 0.25)


def test_two_panel_plot_is_written(law, points, tmp_path):
    from trainer_core.analysis.plots_tasks import plot_task_prediction

    n, d = TARGET
    pred = law.predict(n, d, "7B", float(TRUTH.loss(n, d)), float(TRUTH.acc(n, d)))
    path = plot_task_prediction(law, points, [pred], tmp_path / "synth.png")
    assert path.stat().st_size > 10_000


def drawn_at(artists, xy) -> list:
    """The lines (their data) or scatters (their offsets) drawn at exactly the points ``xy``."""
    return [
        a
        for a in artists
        if close(a.get_offsets() if isinstance(a, Collection) else a.get_xydata(), xy)
    ]


def test_two_panel_plot_draws_both_steps(law, points):
    """Left: each size's final points and the step-1 law along them, the target's law and its
    prediction with the interval, the measured star. Right: every point, the fitted sigmoid and
    chance, the chained prediction with both intervals."""
    n, d = TARGET
    pred = law.predict(n, d, "7B", float(TRUTH.loss(n, d)), float(TRUTH.acc(n, d)))
    left, right = task_prediction_figure(law, points, [pred]).axes
    assert (left.get_xscale(), right.get_xscale()) == ("log", "linear")
    loss, acc = "synth/bpb", f"synth/{law.accuracy}"
    final = final_points(points)
    for size in sorted(points["N"].unique()):
        runs = final[final["N"] == size]
        dots = drawn_at(left.collections, np.column_stack([6 * size * runs["tokens"], runs[loss]]))
        assert [a.get_label() for a in dots] == [f"N={compact(size)}"]
        tokens = np.geomspace(runs["tokens"].min(), runs["tokens"].max(), 30)
        fitted = [law.predict_loss(size, t) for t in tokens]
        assert len(drawn_at(left.lines, np.column_stack([6 * size * tokens, fitted]))) == 1
        sub = points[points["N"] == size]
        assert len(drawn_at(right.collections, sub[[loss, acc]])) == 1
    tokens = np.geomspace(d / 10, d, 40)
    target = np.column_stack([6 * n * tokens, [law.predict_loss(n, t) for t in tokens]])
    assert len(drawn_at(left.lines, target)) == 1
    c, at = 6 * n * d, predicted_at(left, pred)
    lo, hi = pred.loss_interval
    bars(left, [[[at, lo], [at, hi]]])
    assert len(drawn_at(left.collections, [[c, pred.measured_loss]])) == 1
    (sigmoid,) = [ln for ln in right.lines if ln.get_label() == "sigmoid fit"]
    x = sigmoid.get_xdata()
    assert x.min() < min(points[loss].min(), lo) and x.max() == points[loss].max()
    assert close(sigmoid.get_ydata(), law.step2.predict(x))
    (chance,) = [ln for ln in right.lines if ln.get_label() == "chance"]
    assert close(chance.get_ydata(), [TRUTH.chance, TRUTH.chance])
    assert (
        marker(right, [[pred.loss, pred.acc]]).get_label() == "N=7B, D=2T predicted (95% interval)"
    )
    alo, ahi = pred.acc_interval
    bars(right, [[[lo, pred.acc], [hi, pred.acc]]])
    bars(right, [[[pred.loss, alo], [pred.loss, ahi]]])
    assert len(drawn_at(right.collections, [[pred.measured_loss, pred.measured_acc]])) == 1


def predicted_at(ax: Axes, pred: TaskPrediction) -> float:
    """The x of the one marker drawn at the step-1 prediction's task loss."""
    (point,) = [
        ln for ln in ax.lines if ln.get_linestyle() == "None" and close(ln.get_ydata(), [pred.loss])
    ]
    return float(point.get_xdata()[0])


def test_step1_prediction_sits_beside_the_measured_star_and_every_mark_is_named(law, points):
    """On the demo the red predicted point hid under the black measured star at the same C, the
    star was in neither legend, the held-out size's law had no label and the prediction read
    '4.44e+06 tok': now beside the star by a visible share of the axis, all named by N and D."""
    n, d = TARGET
    measured = float(TRUTH.loss(n, d)), float(TRUTH.acc(n, d))
    pred = law.predict(n, d, f"{d:.3g} tok", *measured)
    left, right = task_prediction_figure(law, points, [pred]).axes
    c, at = 6 * n * d, predicted_at(left, pred)
    lo, hi = left.get_xlim()
    assert np.log(at / c) / np.log(hi / lo) > 0.04, "clear of the star"
    tokens = np.geomspace(d / 10, d, 40)
    curve = through(left, 6 * n * tokens, [law.predict_loss(n, t) for t in tokens], "red")
    assert curve.get_label() == "N=7B, D=2T: step-1 law, extrapolated"
    names = ["N=7B, D=2T predicted (95% interval)", "N=7B, D=2T measured"]
    for ax, star in ((left, [[c, measured[0]]]), (right, [measured])):
        assert scatter(ax, star).get_label() == names[1]
        assert set(names) <= {t.get_text() for t in ax.get_legend().get_texts()}
    assert left.get_xlabel() == COMPUTE_LABEL


def test_step_1s_samples_are_its_own_predictions_on_a_frontier_drawn_around_another_law():
    """A frontier whose refits spread about another law's (its ``reference``): step 1's
    samples were rebuilt from the raw refits, centred on that other law, not this one's."""
    from trainer_core.analysis.fits import PowerLawFit
    from trainer_core.analysis.load import analysis_flops
    from trainer_core.analysis.tasks import TaskLaw

    reference = np.array([np.log(0.886), np.log(3675.0), 0.328])
    rng = np.random.default_rng(0)
    refits = reference + rng.standard_normal((200, 3)) * [0.3, 1.0, 0.05]
    front = np.array([np.log(0.210), np.log(58.0), 0.143])
    step1 = PowerLawFit.from_samples(front, refits, 20, 0.0, "t", reference)
    law = TaskLaw("t", step1, step2=None)
    want = step1.predict_samples(analysis_flops(1e6, 2e7))
    assert law.loss_samples(1e6, 2e7) == pytest.approx(want, rel=1e-5)
    assert np.median(want) == pytest.approx(law.predict_loss(1e6, 2e7), rel=0.2)
