"""Known-answer tests of the hyperparameter laws: synthetic sweeps with a planted LR*(N, D) and
B*(D), whose fits must recover them within their intervals and flag what the data leave open."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd
import pytest
from drawn import bars, close, marker, through
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.lines import Line2D
from scipy.stats import t as student_t

from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.hparam_heldout import held_out_check, leave_one_out
from trainer_core.analysis.hparam_laws import (
    Z_CI,
    CellOptimum,
    HparamLaws,
    cell_optima,
    fit_hparam_law,
    fit_hparam_laws,
)
from trainer_core.analysis.lr import fit_lr_power_law
from trainer_core.analysis.plots_hparams import (
    cell_sweeps_figure,
    hparam_law_figure,
    law_groups,
    plot_hparam_laws,
)
from trainer_core.analysis.synthetic_sweep import (
    RATIOS,
    SIZES,
    STEP_LAW_BATCH,
    STEP_LAW_LR,
    PlantedLaw,
    SyntheticSweep,
)

SHRINKING = PlantedLaw(0.5, -0.3, -0.12)
"""LR* falling with the horizon, as Bjorck et al. (2025) find (b negative)."""


def n_bars(ax) -> int:
    """How many error bars the axes draw."""
    return sum(len(col.get_segments()) for c in ax.containers for col in c[2])


def sweep(law: PlantedLaw = STEP_LAW_LR, seed: int = 0, **kw) -> pd.DataFrame:
    return SyntheticSweep(lr_law=law, **kw).table(seed)


def inside(value: float, interval: tuple[float, float]) -> bool:
    return interval[0] <= value <= interval[1]


@pytest.mark.parametrize("law", [STEP_LAW_LR, SHRINKING], ids=["b-positive", "b-negative"])
def test_planted_lr_law_is_recovered_within_its_intervals(law):
    laws = fit_hparam_laws(sweep(law))
    fit = laws.lr
    assert fit.terms == ("N", "D") and not fit.excluded and not fit.notes
    assert inside(law.c, fit.ci["c"])
    assert inside(law.a, fit.ci["N"])
    assert inside(law.b, fit.ci["D"])
    lo, hi = fit.ci["D"]
    assert math.copysign(1, law.b) == math.copysign(1, fit.b)
    assert lo > 0 if law.b > 0 else hi < 0, "the interval resolves b's sign"
    assert "UNRESOLVED" not in str(fit)


def test_batch_optima_all_at_the_grid_edge_leave_no_b_law_but_keep_the_lr_law():
    """A small sweep's best batch can be its largest in every cell (B* beyond the grid): the LR
    law still stands, B* has none, and the text says to widen the batch grid."""
    df = sweep()
    df = df[df["batch"] < df.groupby(["N", "D"])["batch"].transform("median")]
    laws = fit_hparam_laws(df)
    assert laws.batch is None and laws.batch_cells
    assert all(c.at_edge for c in laws.batch_cells)
    assert inside(STEP_LAW_LR.b, laws.lr.ci["D"])
    assert "no cell brackets its batch optimum; widen the batch grid" in str(laws)
    assert laws.predict(1e8, 2e9).batch is None


def test_planted_batch_law_is_recovered_as_a_law_of_d():
    laws = fit_hparam_laws(sweep())
    assert laws.batch is not None and laws.batch.terms == ("D",)
    # 95% intervals: over 12 sweeps, a miss or two (benchmarks/hparam_coverage.py: 95-96%)
    batch_laws = [fit_hparam_laws(sweep(seed=seed)).batch for seed in range(12)]
    covered = [
        inside(STEP_LAW_BATCH.c, b.ci["c"]) and inside(STEP_LAW_BATCH.b, b.ci["D"])
        for b in batch_laws
    ]
    assert sum(covered) >= 9
    assert str(laws.batch).startswith("B*(D) = ")
    both = fit_hparam_law(laws.batch_cells, ("N", "D"))
    assert inside(0.0, both.ci["N"]), "B* planted without N: N's exponent is zero"
    assert any("a (N's exponent)" in note and "sign not resolved" in note for note in both.notes)


def test_a_law_missing_a_term_is_called_a_misfit():
    """B* planted to fall with N: a law of D alone leaves the cells far from it."""
    df = sweep(batch_law=PlantedLaw(5e4, -0.5, 0.571))
    laws = fit_hparam_laws(df)
    assert laws.batch.scatter > 2 and "MISFIT" in str(laws.batch)
    both = fit_hparam_law(laws.batch_cells, ("N", "D"))
    assert inside(-0.5, both.ci["N"]) and "MISFIT" not in str(both)


def test_cell_optima_cover_the_planted_optimum():
    cells = cell_optima(sweep(seed=1), "lr")
    assert len(cells) == len(SIZES) * len(RATIOS)
    covered = [c.low <= STEP_LAW_LR(c.N, c.D) <= c.high for c in cells]
    assert sum(covered) >= 10, "95% intervals: at most a couple of 12 miss"
    assert all(c.method == "quadratic" and not c.at_edge for c in cells)


def test_an_edge_optimum_is_flagged_and_excluded_from_the_law():
    edge = (1e8, 6e9)
    laws = fit_hparam_laws(sweep(lr_shift={edge: 0.1}))
    cell = next(c for c in laws.lr_cells if edge == (c.N, c.D))
    assert cell.at_edge and cell.high == math.inf
    assert str(cell).endswith("  NOT BRACKETED: lowest loss at the grid's largest lr; widen it")
    assert [(c.N, c.D) for c in laws.lr.excluded] == [edge]
    assert "EXCLUDED" in str(laws.lr) and cell.label in str(laws.lr)
    assert inside(STEP_LAW_LR.b, laws.lr.ci["D"])


@pytest.mark.parametrize(
    "cells",
    [[(n, 1e10) for n in SIZES], [(n, 20 * n) for n in SIZES]],
    ids=["one-D-for-all", "one-D-per-N"],
)
def test_one_horizon_per_size_leaves_b_unresolved(cells):
    fit = fit_hparam_laws(sweep(cells=cells)).lr
    assert fit.terms == ("N",) and math.isnan(fit.b)
    assert any(note.startswith("b (D's exponent)") for note in fit.notes)
    assert "UNRESOLVED: b (D's exponent)" in str(fit)


def test_one_size_fits_d_alone_and_leaves_a_unresolved():
    fit = fit_hparam_laws(sweep(cells=[(1e8, 1e8 * r) for r in RATIOS])).lr
    assert fit.terms == ("D",) and math.isnan(fit.a)
    assert any(note.startswith("a (N's exponent)") for note in fit.notes)


def test_held_out_cell_falls_inside_the_predicted_interval():
    cells = cell_optima(sweep(seed=2), "lr")
    n, d = 2e8, 2e8 * 60
    check = held_out_check(cells, n, d)
    assert check.covered and "inside" in str(check)
    assert inside(STEP_LAW_LR(n, d), check.law_interval)
    assert check.interval[0] <= check.law_interval[0] <= check.law_interval[1] <= check.interval[1]
    checks = leave_one_out(cells)
    assert len(checks) == len(cells)
    assert sum(c.covered for c in checks) >= len(checks) - 2


def test_predict_brackets_the_truth_and_names_extrapolation():
    laws = fit_hparam_laws(sweep(seed=3))
    n, d = 1.5e8, 5e9
    p = laws.predict(n, d)
    assert inside(STEP_LAW_LR(n, d), p.lr[1:])
    assert p.batch is not None and inside(STEP_LAW_BATCH(n, d), p.batch[1:])
    assert p.extrapolated == []
    far = laws.predict(7e9, 1.4e12)
    assert far.extrapolated == ["N", "D", "D/N"] and "extrapolated" in str(far)
    # N and D each inside the cells' ranges (5e7..4e8, 1e9..7.2e10), paired at 2.5 and 1440
    # tokens a parameter, where no cell (20..180) is
    assert laws.predict(4e8, 1e9).extrapolated == ["D/N"]
    assert laws.predict(5e7, 7.2e10).extrapolated == ["D/N"]
    assert far.lr[2] / far.lr[1] > p.lr[2] / p.lr[1], "intervals widen away from the data"


def test_stopped_and_diverged_trials_do_not_move_the_optimum():
    df = sweep(seed=4)
    base = cell_optima(df, "lr", seed=0)
    bad = df.iloc[::7].assign(loss=df["loss"].iloc[::7] + 1.0, stopped=True)
    diverged = df.iloc[::11].assign(loss=math.nan, stopped=False)
    dirty = pd.concat([df.assign(stopped=False), bad, diverged], ignore_index=True)
    assert [c.value for c in cell_optima(dirty, "lr", seed=0)] == pytest.approx(
        [c.value for c in base], rel=1e-5
    )


def test_an_asymmetric_curve_is_fitted_over_its_lowest_points():
    """A wall above LR*: a parabola over the whole wide grid sits 40% below LR*."""
    lrs = 1e-3 * 2 ** (np.arange(-8, 9) / 2)
    x = np.log(lrs / 1e-3)
    loss = 3 + 0.05 * x**2 + 0.05 * np.maximum(x, 0) ** 3
    whole = np.polyfit(x, loss, 2)
    assert 1e-3 * math.exp(-whole[1] / (2 * whole[0])) < 0.6e-3
    df = pd.DataFrame({"N": 1e8, "D": 2e9, "lr": lrs, "batch": 2e5, "loss": loss})
    (cell,) = cell_optima(df, "lr")
    assert cell.value == pytest.approx(1e-3, rel=0.1)


def test_without_spare_points_the_interval_is_the_neighbouring_grid_values():
    df = sweep(cells=[(1e8, 2e9)], noise=0.0, n_lr=3, n_batch=1)
    (cell,) = cell_optima(df, "lr")
    lrs = np.sort(df["lr"].unique())
    assert cell.method == "quadratic"
    assert (cell.low, cell.high) == pytest.approx((lrs[0], lrs[2]), rel=1e-5)
    assert cell_optima(df, "batch") == [], "one batch tried: no batch optimum"


def test_a_table_without_the_columns_is_refused():
    with pytest.raises(AnalysisError, match="lacks columns"):
        cell_optima(pd.DataFrame({"N": [1.0], "lr": [1e-3], "loss": [3.0]}))


@pytest.mark.parametrize("column, value", [("D", 0.0), ("N", -1e6), ("N", math.nan)])
def test_a_size_or_horizon_that_is_not_positive_is_refused_by_name(column, value):
    """A table from a published CSV with a zero horizon gave a NaN law and no note (and a
    negative size an SVD error from deep in numpy)."""
    df = sweep()
    df.loc[df.index[5], column] = value
    with pytest.raises(AnalysisError, match=f"{column} must be a positive number.*row 5"):
        fit_hparam_laws(df)


@pytest.fixture(scope="module")
def small_sweep() -> tuple[pd.DataFrame, HparamLaws]:
    """Four bracketed cells and one whose LR optimum is beyond the grid, with both laws fitted."""
    df = sweep(cells=[(n, n * r) for n in SIZES[:2] for r in RATIOS[:2]], n_lr=5, n_batch=3)
    edge = sweep(cells=[(2e8, 4e9)], lr_shift={(2e8, 4e9): 0.1})
    df = pd.concat([df, edge], ignore_index=True)
    laws = fit_hparam_laws(df, n_bootstrap=50)
    assert len(laws.lr.excluded) == 1, "the edge cell is drawn hollow, not fitted"
    assert laws.batch is not None
    return df, laws


def test_plots_of_the_laws_are_written(small_sweep, tmp_path):
    df, laws = small_sweep
    paths = plot_hparam_laws(df, laws.lr, laws.batch, tmp_path)
    assert [p.name for p in paths] == [
        "hparam_lr_cells.png",
        "hparam_lr_vs_N.png",
        "hparam_lr_vs_D.png",
        "hparam_batch_cells.png",
        "hparam_batch_vs_D.png",
    ]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


@pytest.mark.parametrize("param", ["lr", "batch"])
def test_cell_sweeps_draw_each_cells_lowest_losses_and_optimum(small_sweep, param):
    """Per N a panel, per D the lowest loss at each value (a stopped trial's loss left out) and
    the optimum as a star with its interval; not bracketed, a hollow star without a bar."""
    df, laws = small_sweep
    law = getattr(laws, param)
    cells = law.cells + law.excluded
    stopped = df.iloc[::4].assign(loss=0.0, stopped=True)
    fig = cell_sweeps_figure(pd.concat([df, stopped], ignore_index=True), cells, param)
    sizes = sorted({c.N for c in cells})
    assert len(fig.axes) == len(sizes)
    for ax, n in zip(fig.axes, sizes, strict=True):
        assert ax.get_title() == f"N = {n:.3g}" and ax.get_xscale() == "log"
        mine = sorted((c for c in cells if n == c.N), key=lambda c: c.D)
        for c in mine:
            star = marker(ax, [[c.value, c.loss]])
            assert star.get_marker() == "*" and star.get_label() == f"D={c.D:.3g}"
            hollow = to_rgba(star.get_markerfacecolor()) == to_rgba("white")
            assert hollow == c.at_edge, c.label
            if not c.at_edge:
                bars(ax, [[[c.low, c.loss], [c.high, c.loss]]])
            best = df[(df["N"] == n) & (df["D"] == c.D)].groupby(param)["loss"].min()
            through(ax, best.index, best.to_numpy(), star.get_color())
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"D={c.D:.3g}" for c in mine]
        assert n_bars(ax) == sum(not c.at_edge for c in mine), "no bar for an edge optimum"
        optima = [c.loss for c in mine]
        bottom, top = min(optima), max(optima)
        assert close(ax.get_ylim(), [bottom - 0.01 * abs(bottom), top + 0.06 * abs(top)])
    assert any(c.at_edge for c in cells) == (param == "lr"), "a hollow star is checked for LR"


def placed(ax, cells: list, x: str) -> Line2D:
    """The one marker line drawing ``cells``' optima: at their values, each within 10% of its
    cell's ``x`` (set beside the others sharing it)."""
    at = np.array([getattr(c, x) for c in cells])
    found = [
        ln
        for ln in ax.lines
        if ln.get_linestyle() == "None"
        and close(ln.get_ydata(), [c.value for c in cells])
        and np.allclose(ln.get_xdata(), at, rtol=0.1)
    ]
    assert len(found) == 1, f"{len(found)} markers at {[c.label for c in cells]}"
    return found[0]


@pytest.mark.parametrize(
    "param, x, per_value", [("lr", "N", True), ("lr", "D", True), ("batch", "D", False)]
)
def test_law_plot_draws_the_optima_and_the_laws_predictions(small_sweep, param, x, per_value):
    """Optima with their intervals per group (:func:`law_groups`: a value of the other variable,
    or a D/N), hollow where excluded, and the law's prediction along ``x``: a line per group
    where the law depends on what the group fixes (LR*), else one line with its 95% band (B*,
    a law of D alone); every group and style named in the legend."""
    law = getattr(small_sweep[1], param)
    ax = hparam_law_figure(law, x).axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    cells = law.cells + law.excluded
    groups = law_groups(cells, x)
    assert all(g.varies(law) == per_value for g in groups)
    assert sorted(c.label for g in groups for c in g.cells) == sorted(c.label for c in cells)

    def predict(along: np.ndarray, group) -> np.ndarray:
        """(value, low, high) per point along ``x`` in ``group``."""
        return np.array([law.predict(*group.at(x, v)) for v in along])

    dashed = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert len(dashed) == (len(groups) if per_value else 1)
    for group in groups:
        fitted = [c for c in group.cells if c not in law.excluded]
        edge = [c for c in group.cells if c in law.excluded]
        if fitted:
            optima = placed(ax, fitted, x)
            assert optima.get_label() == group.label
            lows, highs = [c.low for c in fitted], [c.high for c in fitted]
            drawn_at = zip(optima.get_xdata(), lows, highs, strict=True)
            bars(ax, [[[at, lo], [at, hi]] for at, lo, hi in drawn_at])
            colour = optima.get_color()
        if edge:
            hollow = placed(ax, edge, x)
            assert to_rgba(hollow.get_markerfacecolor()) == to_rgba("white")
            assert fitted or hollow.get_label() == group.label
            colour = hollow.get_color()
        if per_value:
            span = [getattr(c, x) for c in group.cells]
            (law_line,) = [
                ln for ln in dashed if close(ln.get_ydata(), predict(ln.get_xdata(), group)[:, 0])
            ]
            assert close(to_rgba(law_line.get_color()), to_rgba(colour))
            along = law_line.get_xdata()
            assert along.min() < min(span) and along.max() > max(span)
    edge_key = ["optimum at the grid's edge (not fitted)"] if law.excluded else []
    law_key = f"{law.name} at each {groups[0].by}" if per_value else f"{law.name}, 95% band shaded"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [g.label for g in groups] + edge_key + [law_key]
    assert n_bars(ax) == len(law.cells), "the excluded cells are drawn without a bar"
    if not per_value:
        (law_line,) = dashed
        along = law_line.get_xdata()
        assert along.min() < min(getattr(c, x) for c in cells)
        assert along.max() > max(getattr(c, x) for c in cells)
        at = predict(along, groups[0])
        assert close(law_line.get_ydata(), at[:, 0])
        (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
        edges = np.vstack([np.column_stack([along, at[:, 1]]), np.column_stack([along, at[:, 2]])])
        assert close(np.unique(band.get_paths()[0].vertices, axis=0), np.unique(edges, axis=0))


def test_a_sweep_dir_reads_as_annealed_points_one_horizon_per_decay(tmp_path):
    import json

    from synthetic_hparams import RATIOS as DIR_RATIOS
    from synthetic_hparams import make_hparam_sweep

    from trainer_core.analysis import hparam_table, load

    sizes = {"a": 1_000_000, "b": 4_000_000}
    root = make_hparam_sweep(tmp_path / "sweep", sizes, batch_factors=(0.5, 1.0, 2.0))
    record = root / "runs" / "a-lr0-b1" / "run.json"
    run = json.loads(record.read_text())
    record.write_text(json.dumps({**run, "status": "diverged"}))
    table = hparam_table(load(root))
    # no peak-LR point; the diverged run's decays count (its record ends before it diverged)
    assert len(table) == 2 * 7 * 3 * len(DIR_RATIOS)
    assert table["loss"].max() < 50, "the eval at peak LR before a decay is left out"
    for n, rows in table.groupby("N"):
        horizons = sorted(rows["D"].unique())
        assert horizons == pytest.approx([r * n for r in DIR_RATIOS], rel=0.01)


def coupled_sweep(best_batch: float, batches: list[float]) -> pd.DataFrame:
    """LR* growing as sqrt(batch) (as under Adam at small batch), B* = ``best_batch``: a grid of
    LRs x ``batches`` per cell, no noise."""
    rows = []
    for n, d in [(1e7, 2e8), (1e7, 8e8), (4e7, 8e8), (4e7, 3.2e9), (1.6e8, 3.2e9)]:
        for b in batches:
            lr_star = 0.01 * (n / 1e7) ** -0.5 * (b / best_batch) ** 0.5
            for k in range(-3, 4):
                lr = lr_star * 2.0 ** (k + 0.25)
                loss = 3 + 0.05 * math.log(lr / lr_star) ** 2 + 0.03 * math.log(b / best_batch) ** 2
                rows.append((n, d, lr, b, loss))
    return pd.DataFrame(rows, columns=["N", "D", "lr", "batch", "loss"])


def test_an_lr_optimum_at_the_batch_grids_edge_is_called_conditional():
    """B* below the batch grid: each cell's best LR is the best at the smallest batch (over
    twice the joint optimum's LR here), which the law gave with an interval excluding the
    joint optimum and no word."""
    laws = fit_hparam_laws(coupled_sweep(100, [400, 800, 1600]), n_bootstrap=50)
    assert all("batch 400, the smallest tried" in c.conditional for c in laws.lr_cells)
    assert "CONDITIONAL: best trial at batch 400" in str(laws.lr_cells[0])
    assert laws.lr.conditional.startswith("CONDITIONAL: in 5 of 5 cells the best trial's batch")
    assert "widen the batch grid" in str(laws.lr)
    joint = 0.01 * (1e7 / 1e7) ** -0.5
    lr, low, high = laws.lr.predict(1e7, 8e8)
    assert lr > 2 * joint and not low <= joint <= high  # the smallest batch's LR, not the joint
    inside_grid = fit_hparam_laws(coupled_sweep(800, [200, 400, 800, 1600, 3200]), n_bootstrap=50)
    assert not any(c.conditional for c in inside_grid.lr_cells + inside_grid.batch_cells)
    assert inside_grid.lr.predict(1e7, 8e8)[0] == pytest.approx(joint, rel=1e-4)
    assert "CONDITIONAL" not in str(inside_grid.lr)


def test_the_sweep_benchmarks_target_is_two_positive_numbers():
    """``hparam_sweep.py --predict`` parsed its own floats: -1, nan and inf reached the laws."""
    from scripts import load_script

    n_and_d = load_script("benchmarks/hparam_sweep.py").n_and_d
    assert n_and_d("1e8,2e9") == (1e8, 2e9)
    for bad, why in (("-1,2e9", "must be > 0"), ("nan,1e9", "finite"), ("1e8", "is not N,D")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            n_and_d(bad)


def test_a_trial_stopped_before_a_horizon_brackets_that_cell_as_worse():
    """ASHA stopped lr 1e-3 after the first decay; at the second the best finished LR is the
    smallest that finished. Early stopping judged 1e-3 worse there, so the cell is bracketed,
    as the sweep report's optimum is (it was NOT BRACKETED, and left out of the law)."""
    from types import SimpleNamespace

    from trainer_core.analysis.hparam_table import hparam_table

    runs = pd.DataFrame(
        {
            "name": ["a", "b", "c"],
            "size": "s",
            "num_params": 1e6,
            "peak_lr": [1e-3, 2e-3, 4e-3],
            "global_batch_tokens": 2048,
            "status": ["stopped", "finished", "finished"],
        }
    )
    points = pd.DataFrame(
        [
            (name, d, loss)
            for name, d, loss in [
                ("a", 1e7, 3.3),
                ("b", 1e7, 3.1),
                ("c", 1e7, 3.2),
                ("b", 2e7, 2.9),
                ("c", 2e7, 3.0),
            ]
        ],
        columns=["name", "tokens", "eval_loss"],
    )
    points = points.assign(
        annealed=True,
        N=1e6,
        peak_lr=points["name"].map(dict(zip(runs["name"], runs["peak_lr"], strict=True))),
    )
    table = hparam_table(SimpleNamespace(runs=runs, points=points))
    worse = table[table["loss"] == math.inf]
    assert list(worse["name"]) == ["a"] and list(worse["D"]) == [pytest.approx(2e7)]
    late = next(c for c in cell_optima(table, "lr") if c.D > 1.5e7)
    assert not late.at_edge and late.value == pytest.approx(2e-3)
    assert (late.low, late.high) == pytest.approx((1e-3, 4e-3))


def test_a_trial_diverged_before_a_horizon_brackets_that_cell_as_worse():
    """lr 4e-3 finished the first decay and diverged before the second, where the best
    finished LR is the largest that finished: the cell was NOT BRACKETED and left out of the
    law. A diverged trial counts as a stopped one does: its decay's loss where it has one, worse
    than every finished trial past it, so the upper bound is its LR."""
    from types import SimpleNamespace

    from trainer_core.analysis.hparam_table import hparam_table

    lrs = {"a": 1e-3, "b": 2e-3, "c": 4e-3}
    runs = pd.DataFrame(
        {
            "name": list(lrs),
            "size": "s",
            "num_params": 1e6,
            "peak_lr": list(lrs.values()),
            "global_batch_tokens": 2048,
            "status": ["finished", "finished", "diverged"],
        }
    )
    decays = [("a", 1e7, 3.3), ("b", 1e7, 3.1), ("c", 1e7, 3.2), ("a", 2e7, 3.0), ("b", 2e7, 2.9)]
    points = pd.DataFrame(decays, columns=["name", "tokens", "eval_loss"])
    points = points.assign(annealed=True, N=1e6, peak_lr=points["name"].map(lrs))
    table = hparam_table(SimpleNamespace(runs=runs, points=points))
    assert table.loc[table["name"] == "c", "loss"].tolist() == [3.2, math.inf]
    early, late = cell_optima(table, "lr")
    assert not early.at_edge and early.method == "quadratic"  # c's decay counts there
    assert not late.at_edge and late.value == pytest.approx(2e-3)
    assert (late.low, late.high) == pytest.approx((1e-3, 4e-3))


def cells_about_a_line(scatter: float, sigma: float = 0.05) -> list[CellOptimum]:
    """Four sizes' LR* on 0.01 N^-0.5 off by +r, -r, -r, +r in log (orthogonal to the line, so
    the fit is the line), r making them stray ``scatter`` times their intervals (sigma)."""
    n = np.array([1e6, 4e6, 1.6e7, 6.4e7])
    r = scatter * sigma / math.sqrt(2)  # chi^2 = 4 r^2 / sigma^2 on 2 dof
    lrs = 0.01 * n**-0.5 * np.exp(r * np.array([1, -1, -1, 1]))
    half = math.exp(Z_CI * sigma)
    return [
        CellOptimum(N, 1e9, "lr", lr, lr / half, lr * half, 3.0, "quadratic", False, 5)
        for N, lr in zip(n, lrs, strict=True)
    ]


@pytest.mark.parametrize("scatter", [0.3, 0.7, 1.5])
def test_lr_of_n_and_a_law_of_n_are_one_fit_widened_by_one_rule(scatter):
    """A sweep's LR*(N) and a law of N through the same optima: one estimate, one scatter, and
    one interval. The law's bootstrap was widened only past a scatter of 1, LR*(N) wherever t
    on its spare dof times the scatter passed the normal's 1.96 (0.46 at 2 dof): at 0.7 one
    said b +- 2.0 sigma, the other +- 3.0. Now both take the wider of the two."""
    cells = cells_about_a_line(scatter)
    law = fit_hparam_law(cells, ("N",), n_bootstrap=20_000)
    lr = fit_lr_power_law([c.N for c in cells], [c.value for c in cells], [0.05] * 4)
    assert (law.c, law.a, law.scatter) == pytest.approx((lr.a, lr.b, scatter), rel=1e-5)
    assert lr.scatter == pytest.approx(scatter, rel=1e-5)
    by_scatter = student_t.ppf(0.975, 2) * scatter > Z_CI
    assert (lr.t_dof, "t =" in str(lr)) == ((2, True) if by_scatter else (math.inf, False))
    half = float(student_t.ppf(0.975, lr.t_dof)) * lr.b_stderr
    assert (law.ci["N"][1] - law.ci["N"][0]) / 2 == pytest.approx(half, rel=0.03)
