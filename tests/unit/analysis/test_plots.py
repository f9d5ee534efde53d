"""Analysis on synthetic experiment dirs written to disk from known scaling-law constants."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from drawn import band, bars, close, line, marker, scatter, through
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from synthetic_experiments import (
    SWEEP_N,
    is_png,
)

from trainer_core.analysis import (
    extrapolation_check,
    fit_loss_vs_compute,
    fit_lr_power_law,
    frontier_points,
    load,
    lr_sweep_table,
    optimal_lrs,
    plot_loss_curves,
    plot_loss_vs_compute,
    plot_lr_sweep,
    plot_lr_vs_size,
)
from trainer_core.analysis.plots import (
    COMPUTE_LABEL,
    grid_centres,
    loss_curves_figure,
    lr_sweep_figure,
    lr_vs_size_figure,
)
from trainer_core.analysis.plots_scaling import loss_vs_compute_figure
from trainer_core.analysis.predict import LAW_CHINCHILLA, LAW_FRONTIER, HeldOutPrediction


def test_plots_write_pngs(ladder_dir: Path, sweep_dir: Path, tmp_path: Path):
    res = load(ladder_dir)
    pts = res.fit_points()
    law = fit_loss_vs_compute(pts["flops"], pts["eval_loss"], n_bootstrap=0)
    check = extrapolation_check(pts)
    table = lr_sweep_table(load(sweep_dir))
    optima = optimal_lrs(table)
    n = [SWEEP_N[s] for s in optima]
    lrs = [o.lr for o in optima.values()]
    paths = [
        plot_loss_curves(res, tmp_path / "curves.png"),
        plot_loss_vs_compute(
            pts, law, frontier_points(pts), tmp_path / "compute.png", held_out=check
        ),
        plot_lr_sweep(table, optima, tmp_path / "sweep.png"),
        plot_lr_vs_size(n, lrs, fit_lr_power_law(n, lrs), tmp_path / "sub" / "lr_n.png"),
    ]
    assert all(is_png(p) for p in paths)


@pytest.mark.parametrize("which", ["both", "train", "eval"])
def test_loss_curves_draw_each_runs_losses_by_tokens(sweep_dir: Path, which: str):
    """The sweep has several runs per size, stopped ones with a single point and diverged ones
    with no train loss: every run's curve, one colour per size, each size named once."""
    res = load(sweep_dir)
    ax = loss_curves_figure(res, which).axes[0]
    assert ax.get_xscale() == "log"
    sizes = list(res.runs.drop_duplicates("size")["size"])
    named = [ln for ln in ax.lines if not ln.get_label().startswith("_")]
    assert [ln.get_label() for ln in named] == sizes
    colour = {ln.get_label(): to_rgba(ln.get_color()) for ln in named}
    assert len(set(colour.values())) == len(sizes), "one colour per size"
    legend = ax.get_legend()
    assert legend.get_title().get_text() == "size"
    assert [t.get_text() for t in legend.get_texts()] == sizes
    kinds = {"train": ("train_loss", "None"), "eval": ("eval_loss", "o")}
    curves = 0
    for name, m in res.metrics.groupby("name"):
        for loss, style in (kinds[k] for k in kinds if which in (k, "both")):
            run = m.dropna(subset=[loss])
            if len(run):
                curve = through(ax, run["tokens"], run[loss], colour[m["size"].iloc[0]])
                assert curve.get_marker() == style, (name, loss)
                curves += 1
    assert sum(len(ln.get_xdata()) > 0 for ln in ax.lines) == curves, "no other curve"


def test_loss_vs_compute_draws_points_fit_and_held_out(ladder_dir: Path):
    pts = load(ladder_dir).fit_points()
    law = fit_loss_vs_compute(pts["flops"], pts["eval_loss"], n_bootstrap=0)
    front = frontier_points(pts)
    check = extrapolation_check(pts, n_bootstrap=20)
    ax = loss_vs_compute_figure(pts, law, front, check).axes[0]
    assert ax.get_xscale() == "log"
    for size, p in pts.groupby("size"):
        x, y = line(ax, size)
        p = p.sort_values("flops")
        assert close(x, p["flops"]) and close(y, p["eval_loss"]), size
    assert scatter(ax, front[["flops", "eval_loss"]]).get_label() == "frontier (lower envelope)"
    x, y = line(ax, "frontier fit: ")
    assert x.min() < pts["flops"].min() and x.max() > pts["flops"].max()
    assert close(y, law.predict(x))
    x, y = line(ax, "frontier fit without it")
    assert close(y, check.fits[LAW_FRONTIER].predict(x))
    assert {p.law for p in check.predictions} == {LAW_CHINCHILLA, LAW_FRONTIER}
    for p in check.predictions:
        x = drawn_prediction(ax, p)
        lo, hi = p.interval
        bars(ax, [[[x, lo], [x, hi]]])
    measured = scatter(ax, check.points[["flops", "actual"]])
    assert measured.get_label() == f"held out {check.held_out_size} (measured)"
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {*pts["size"], measured.get_label(), "frontier fit without it"} <= legend
    assert not [c for c in ax.collections if "band" in c.get_label()], "no bootstrap, no band"


def test_the_frontier_fit_is_drawn_with_its_band_out_to_the_target(ladder_dir: Path):
    """The answer is read at a target compute past the runs: the axis reaches it and marks it,
    and the fit's bootstrap band shows how much wider the prediction is there than among the
    points."""
    pts = load(ladder_dir).fit_points()
    law = fit_loss_vs_compute(pts["flops"], pts["eval_loss"], n_bootstrap=20)
    target = 10 * pts["flops"].max()
    ax = loss_vs_compute_figure(pts, law, frontier_points(pts), None, target).axes[0]
    x, _ = line(ax, "frontier fit: ")
    assert x.max() > target
    lo, hi = law.predict_interval(x)
    edges = np.unique(np.concatenate([np.column_stack([x, lo]), np.column_stack([x, hi])]), axis=0)
    assert close(band(ax, "frontier fit: 95% bootstrap band"), edges)
    (mark,) = [ln for ln in ax.lines if ln.get_label() == f"target {target:.3g}"]
    assert close(mark.get_xdata(), [target, target])
    centre = np.exp(np.log(pts["flops"]).mean())
    (t_lo, t_hi), (c_lo, c_hi) = law.predict_interval(target), law.predict_interval(centre)
    assert t_hi - t_lo > 2 * (c_hi - c_lo)


def drawn(ax: Axes) -> list[tuple[str, np.ndarray]]:
    """Every line of a panel: its label and points, in draw order."""
    return [(ln.get_label(), np.asarray(ln.get_xydata(), dtype=float)) for ln in ax.lines]


def test_one_panel_figures_draw_into_the_callers_panel(ladder_dir: Path, sweep_dir: Path):
    """A notebook lays out its own figure (``plt.subplots``, subfigures): each one-panel
    figure draws into the panel it is given as it draws alone, and returns the figure."""
    res = load(ladder_dir)
    pts = res.fit_points()
    law = fit_loss_vs_compute(pts["flops"], pts["eval_loss"], n_bootstrap=0)
    front = frontier_points(pts)
    fig = Figure(figsize=(12, 4))
    left, right = fig.subplots(1, 2)
    assert loss_curves_figure(res, ax=left) is fig
    assert loss_vs_compute_figure(pts, law, front, ax=right) is fig
    assert fig.axes == [left, right]
    for mine, alone in (
        (left, loss_curves_figure(res).axes[0]),
        (right, loss_vs_compute_figure(pts, law, front).axes[0]),
    ):
        ours, theirs = drawn(mine), drawn(alone)
        assert [label for label, _ in ours] == [label for label, _ in theirs]
        assert all(close(a, b) for (_, a), (_, b) in zip(ours, theirs, strict=True))
        assert mine.get_title() == alone.get_title()
    table = lr_sweep_table(load(sweep_dir))
    outer = Figure()
    panel = outer.subfigures(1, 2)[1].subplots()
    assert lr_sweep_figure(table, optimal_lrs(table), ax=panel) is outer
    assert panel.get_xscale() == "log" and len(panel.lines) > 0


def drawn_prediction(ax: Axes, p: HeldOutPrediction) -> float:
    """The x of a held-out prediction's marker, drawn at its value beside its C (the next test)."""
    x, y = line(ax, f"{p.law} prediction")
    assert close(y, [p.predicted])
    return float(x[0])


def test_held_out_predictions_are_drawn_apart_either_side_of_their_compute(ladder_dir: Path):
    """On the demo both laws predict the held-out point at one C, and their bars were drawn on
    top of each other: L(N, D)'s now left of C, the frontier's right, a visible share of the axis
    apart, each labelled with its interval. The axis names C as the task plot does."""
    pts = load(ladder_dir).fit_points()
    check = extrapolation_check(pts, n_bootstrap=20)
    chin, front = check.prediction(LAW_CHINCHILLA), check.prediction(LAW_FRONTIER)
    check.predictions = [chin, replace(front, flops=chin.flops)]
    ax = loss_vs_compute_figure(pts, None, frontier_points(pts), check).axes[0]
    left, right = (drawn_prediction(ax, p) for p in check.predictions)
    assert left < chin.flops < right
    lo, hi = ax.get_xlim()
    assert np.log(right / left) / np.log(hi / lo) > 0.04, "apart by more than a marker's width"
    for p, x in zip(check.predictions, (left, right), strict=True):
        bars(ax, [[[x, p.interval[0]], [x, p.interval[1]]]])
        assert line(ax, f"{p.law} prediction, 95% interval")
    assert ax.get_xlabel() == COMPUTE_LABEL == "compute C = 6ND (FLOPs, attention not counted)"


def test_an_estimate_outside_its_interval_is_drawn_beside_the_interval(ladder_dir: Path):
    """A percentile interval of skewed refits need not hold its estimate (the frontier's did not,
    on the demo, when its refits spread around L(N, D)): the bars were drawn relative to the
    marker, came out negative, and matplotlib's refusal ended analyze.py."""
    pts = load(ladder_dir).fit_points()
    check = extrapolation_check(pts, n_bootstrap=20)
    p = check.prediction(LAW_FRONTIER)
    below = (0.9 * p.predicted, 0.95 * p.predicted)
    check.predictions = [
        replace(q, interval=below) if q.law == LAW_FRONTIER else q for q in check.predictions
    ]
    ax = loss_vs_compute_figure(pts, None, frontier_points(pts), check).axes[0]
    x = drawn_prediction(ax, p)
    bars(ax, [[[x, below[0]], [x, below[1]]]])


def test_lr_sweep_draws_each_size_with_stopped_diverged_and_optimum(sweep_dir: Path):
    table = lr_sweep_table(load(sweep_dir))
    optima = optimal_lrs(table)
    ax = lr_sweep_figure(table, optima).axes[0]
    assert ax.get_xscale() == "log"
    losses = table.loc[~table["diverged"], "compared_loss"]
    finite = losses[np.isfinite(losses)]
    top = finite.max() + 0.05 * np.ptp(finite)  # a band above every drawn loss
    stopped_at = []
    for size, t in table.groupby("size"):
        t = t.sort_values("lr")
        ok, bad = t[~t["diverged"]], t[t["diverged"]]
        done, stopped = ok[~ok["stopped_early"]], ok[ok["stopped_early"]]
        x, y = line(ax, f"{size} (at step 100)")
        assert close(x, done["lr"]) and close(y, done["compared_loss"]), size
        assert len(done) and len(stopped) and len(bad), "the sweep has each kind of trial"
        filled = scatter(ax, done[["lr", "compared_loss"]])
        # stopped before step 100: judged worse, no loss there; diverged: x; both at the top
        hollow = scatter(ax, np.column_stack([stopped["lr"], np.full(len(stopped), top)]))
        assert close(hollow.get_facecolors(), [to_rgba("white")])
        assert close(hollow.get_edgecolors(), filled.get_facecolors())
        assert not close(filled.get_facecolors(), [to_rgba("white")])
        scatter(ax, np.column_stack([bad["lr"], np.full(len(bad), top)]))
        stopped_at += [(r.lr, top, f"stopped@{r.steps_run}") for r in stopped.itertuples()]
        o = optima[size]
        assert marker(ax, [[o.lr, o.loss]]).get_marker() == "*"
        bars(ax, [[[o.lr_low, o.loss], [o.lr_high, o.loss]]])
    drawn = [(*a.xy, a.get_text()) for a in ax.texts]
    assert sorted(drawn) == sorted(stopped_at)


def bar_segments(ax) -> np.ndarray:
    """Every error bar drawn, as (n, 2, 2) segments."""
    found = [seg for c in ax.containers for col in c[2] for seg in col.get_segments()]
    return np.asarray(found, dtype=float).reshape(-1, 2, 2)


def test_an_optimum_at_its_grids_edge_is_drawn_hollow_without_a_bar(sweep_dir: Path):
    """An edge optimum is a bound: hollow and without its interval's bar, in the sweep's
    figure and in LR* against N alike; the bracketed ones filled, each with its bar."""
    optima = optimal_lrs(lr_sweep_table(load(sweep_dir)))
    optima["d"] = replace(optima["d"], at_edge=True)  # its finite interval must not be drawn
    edge, inside = optima["d"], [o for size, o in optima.items() if size != "d"]
    ax = lr_sweep_figure(lr_sweep_table(load(sweep_dir)), optima).axes[0]
    star = marker(ax, [[edge.lr, edge.loss]])
    assert star.get_marker() == "*" and to_rgba(star.get_markerfacecolor()) == to_rgba("white")
    assert not np.isclose(bar_segments(ax)[:, :, 1], edge.loss).any()
    for o in inside:
        assert to_rgba(marker(ax, [[o.lr, o.loss]]).get_markerfacecolor()) != to_rgba("white")
        bars(ax, [[[o.lr_low, o.loss], [o.lr_high, o.loss]]])
    n = [SWEEP_N[s] for s in optima]
    lows, highs = [o.lr_low for o in optima.values()], [o.lr_high for o in optima.values()]
    at_edge = [o.at_edge for o in optima.values()]
    lrs = [o.lr for o in optima.values()]
    ax = lr_vs_size_figure(n, lrs, None, (lows, highs), at_edge).axes[0]
    hollow = marker(ax, [[SWEEP_N["d"], edge.lr]])
    assert to_rgba(hollow.get_markerfacecolor()) == to_rgba("white")
    filled = marker(ax, [[SWEEP_N[s], o.lr] for s, o in optima.items() if s != "d"])
    assert filled.get_label() == "optimal LR"
    assert to_rgba(filled.get_markerfacecolor()) != to_rgba("white")
    assert not np.isclose(bar_segments(ax)[:, :, 0], SWEEP_N["d"]).any()
    assert len(bar_segments(ax)) == len(inside)


def test_lr_vs_size_draws_optima_fit_and_reference(sweep_dir: Path):
    optima = optimal_lrs(lr_sweep_table(load(sweep_dir)))
    n = np.array([SWEEP_N[s] for s in optima], dtype=float)
    lrs = np.array([o.lr for o in optima.values()])
    lows, highs = [o.lr_low for o in optima.values()], [o.lr_high for o in optima.values()]
    fit = fit_lr_power_law(n, lrs)
    ax = lr_vs_size_figure(n, lrs, fit, (lows, highs)).axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert marker(ax, np.column_stack([n, lrs])).get_label() == "optimal LR"
    bars(ax, [[[x, lo], [x, hi]] for x, lo, hi in zip(n, lows, highs, strict=True)])
    x, y = line(ax, "fit: N^")
    assert x.min() < n.min() and x.max() > n.max()
    assert close(y, fit.predict(x))
    x, y = line(ax, "N^-0.333 slope (OLMo's rule), for comparison")
    n0, lr0 = np.exp(np.log(n).mean()), np.exp(np.log(lrs).mean())
    assert close(y, lr0 * (x / n0) ** (-1 / 3))


def test_lr_vs_size_draws_the_grids_centre_not_a_ladder_default():
    """A sweep centred on its config's own rule (N^-0.67 in the demo) whose optima sit at the
    grid's centre fits that rule back: the centre is drawn, its slope named beside the fit's,
    and the N^-1/3 line is named as the comparison it is, not as the grid's default."""
    n = np.array([21672.0, 37088.0])
    centre = 0.00069 * (n / 1e6) ** -0.67
    fit = fit_lr_power_law(n, centre)
    ax = lr_vs_size_figure(n, centre, fit, centre=centre).axes[0]
    x, y = line(ax, "sweep grid's centre (factor 1): N^-0.670")
    assert close(x, n) and close(y, centre)
    line(ax, "fit: N^-0.670")
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not [t for t in texts if "default" in t], texts
    unknown = np.array([centre[0], np.nan])  # a size of an older sweep, without its factor
    ax = lr_vs_size_figure(n, centre, fit, centre=unknown).axes[0]
    x, y = line(ax, "sweep grid's centre")
    assert close(x, n[:1]) and close(y, centre[:1])


def test_grid_centres_are_each_sizes_lr_at_factor_one():
    """The centre is a trial's LR over its factor, whichever trials a size ran (factor 1 or
    not, as a random search has none); trials without the tag (older sweeps) give none."""
    runs = pd.DataFrame(
        {
            "size": ["15K", "15K", "25K", "old"],
            "peak_lr": [0.0045, 0.018, 0.0125, 0.003],
            "tag_lr_factor": [0.5, 2.0, 2.0, None],
        }
    )
    assert grid_centres(runs) == pytest.approx({"15K": 0.009, "25K": 0.00625})
    assert grid_centres(runs.drop(columns="tag_lr_factor")) == {}


def test_the_lr_sweeps_title_fits_in_its_figure(sweep_dir: Path):
    """Its key to the markers ran past the figure's right edge ("x dive..."): every line of it
    inside the figure as saved (after ``tight_layout``, as ``save`` does)."""
    table = lr_sweep_table(load(sweep_dir))
    fig = lr_sweep_figure(table, optimal_lrs(table))
    FigureCanvasAgg(fig)
    fig.tight_layout()
    title = fig.axes[0].title
    box = title.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height
    assert "x: diverged" in title.get_text()
