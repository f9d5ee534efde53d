"""The LR-sweep report shows what a ladder fed from the sweep plans with (the cells' optima,
LR*(N, D) and B* as ``lr.from_sweep`` / ``batch.from_sweep`` fit them, or the line that stops
the plan, or the LR*(N) fallback and why), and tells a sweep's batches apart."""

from __future__ import annotations

import shutil
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from drawn import line
from rich.console import Console
from synthetic_experiments import is_png
from synthetic_hparams import make_hparam_sweep

from trainer_core.analysis import (
    cell_optima,
    fit_sweep_lr,
    hparam_table,
    load,
    lr_sweep_table,
    optimal_lrs,
    report_experiment,
)
from trainer_core.analysis.plots import lr_sweep_figure
from trainer_core.analysis.synthetic_sweep import STEP_LAW_LR, PlantedLaw
from trainer_core.config.loader import ConfigError, from_dict
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.lr_feedback import sweep_rules
from trainer_core.ladder.plan import plan_ladder

SIZES = ["1M", "3M", "5M"]
LAW_PNGS = ["hparam_lr_cells.png", "hparam_lr_vs_N.png", "hparam_lr_vs_D.png"]
BATCH_PNGS = ["hparam_batch_cells.png", "hparam_batch_vs_D.png"]


def ladder_sizes() -> dict[str, int]:
    return {p.size: p.num_params for p in plan_ladder(from_dict(LadderConfig, {}), SIZES)}


def fed_from(sweep: Path, tmp_path: Path, batch: bool = True) -> LadderConfig:
    """A ladder taking its LR (and batch) from ``sweep``."""
    sections = {"lr": {"from_sweep": str(sweep)}}
    if batch:
        sections["batch"] = {"from_sweep": str(sweep)}
    return from_dict(LadderConfig, {"dir": str(tmp_path / "ladder"), "sizes": SIZES, **sections})


def report_text(sweep: Path) -> str:
    console = Console(file=StringIO(), width=200, markup=False, soft_wrap=True)
    report_experiment(sweep, console=console)
    return console.file.getvalue()


@pytest.fixture(scope="module")
def lr_and_batch_sweep(tmp_path_factory) -> Path:
    return make_hparam_sweep(tmp_path_factory.mktemp("hparams"), ladder_sizes())


def test_the_report_prints_the_cells_and_the_laws_the_ladder_plans_with(
    lr_and_batch_sweep, tmp_path
):
    text = report_text(lr_and_batch_sweep)
    table = hparam_table(load(lr_and_batch_sweep))
    for param in ("lr", "batch"):
        cells = cell_optima(table, param)
        assert len(cells) == 9
        assert all(f"  {cell}\n" in text for cell in cells), param
    rules = sweep_rules(fed_from(lr_and_batch_sweep, tmp_path))
    assert f"lr.from_sweep: each size at its run's final D: {rules.lr_law}\n" in text
    assert f"batch.from_sweep (batch.sweep_law: D): {rules.batch_law}\n" in text
    assert "batch (tokens)" in text, "five batches per size: the table names each trial's"
    analysis = lr_and_batch_sweep / "analysis"
    assert all(is_png(analysis / name) for name in LAW_PNGS + BATCH_PNGS)
    assert all(f"analysis/{name}\n" in text for name in LAW_PNGS + BATCH_PNGS)


def test_the_report_prints_the_line_that_stops_the_ladders_plan(tmp_path):
    """LR* planted flat in D under noise: D's exponent spans zero and lr.from_sweep refuses;
    the report says so with the same line, and still draws the cells."""
    flat = PlantedLaw(STEP_LAW_LR.c, STEP_LAW_LR.a, 0.0)
    sweep = make_hparam_sweep(tmp_path / "flat", ladder_sizes(), flat, noise=0.02)
    with pytest.raises(ConfigError) as refused:
        sweep_rules(fed_from(sweep, tmp_path, batch=False))
    text = report_text(sweep)
    assert f"a ladder's plan stops here: {refused.value}\n" in text
    assert "sign not resolved" in str(refused.value)
    assert is_png(sweep / "analysis" / "hparam_lr_cells.png")
    assert not (sweep / "analysis" / "hparam_lr_vs_N.png").exists()


def test_a_one_horizon_sweep_reports_the_lr_of_n_fallback_and_why(tmp_path):
    sweep = make_hparam_sweep(tmp_path / "one", ladder_sizes(), ratios=(40.0,), batch_factors=(1,))
    text = report_text(sweep)
    fallback = f"{fit_sweep_lr(sweep)} (one horizon per size: not moved with D)"
    rules = sweep_rules(fed_from(sweep, tmp_path, batch=False))
    assert rules.lr(1e6, 1e8).law == fallback
    assert f"lr.from_sweep: {fallback}\n" in text
    assert "  falls back to LR*(N): the sweep has annealed evals at one D per size" in text
    assert "batch optimum" not in text and "batch (tokens)" not in text
    assert is_png(sweep / "analysis" / "hparam_lr_cells.png")


def test_the_reports_lr_of_n_is_the_ladders_with_a_size_left_out(tmp_path):
    """5M's grid cut below its optimum: its best LR is at the grid's edge. The report fits
    LR*(N) with fit_sweep_lr, the ladder's call, so both leave 5M out, and the report says so."""
    sweep = make_hparam_sweep(tmp_path / "cut", ladder_sizes(), ratios=(40.0,), batch_factors=(1,))
    for i in range(-3, 1):
        shutil.rmtree(sweep / "runs" / f"5M-lr{i}-b1")
    fit = fit_sweep_lr(sweep)
    assert fit.left_out == ("5M",) and fit.n_points == 2
    console = Console(file=StringIO(), width=200, markup=False, soft_wrap=True)
    report = report_experiment(sweep, console=console)
    text = console.file.getvalue()
    assert str(report.lr_law) == str(fit) and report.lr_law.left_out == fit.left_out
    assert (report.lr_law.a, report.lr_law.b) == (fit.a, fit.b)
    assert f"{fit}\n" in text
    assert (
        "skipped lr*(N) leaves out 5M: the best LR of 5M is at its grid's edge (the optimum may "
        "lie beyond it); widen those sizes' LR grids\n"
    ) in text
    rules = sweep_rules(fed_from(sweep, tmp_path, batch=False))
    assert rules.lr(1e6, 1e8).law == f"{fit} (one horizon per size: not moved with D)"
    assert f"lr.from_sweep: {rules.lr(1e6, 1e8).law}\n" in text


def test_the_sweep_plot_draws_one_line_per_size_and_batch_compared_in_tokens(tmp_path):
    """Two batches per size: not one line zigzagging between them at each LR, labelled with a
    step that only one batch's trials were compared at."""
    sweep = make_hparam_sweep(
        tmp_path / "two", ladder_sizes(), ratios=(10.0, 40.0), batch_factors=(1.0, 2.0)
    )
    table = lr_sweep_table(load(sweep))
    ax = lr_sweep_figure(table, optimal_lrs(table)).axes[0]
    assert ax.get_ylabel() == "eval loss at the common tokens"
    assert not any("step" in ln.get_label() for ln in ax.lines)
    for size, rows in table.groupby("size"):
        styles = set()
        for batch, trials in rows.groupby("batch"):
            tokens = trials["compared_tokens"].max()
            x, y = line(ax, f"{size}, {batch:,} (at {tokens:.4g} tokens)")
            assert np.array_equal(x, np.sort(trials["lr"].to_numpy()))
            assert np.allclose(y, trials.sort_values("lr")["compared_loss"])
            (drawn,) = [ln for ln in ax.lines if ln.get_label().startswith(f"{size}, {batch:,}")]
            styles.add((drawn.get_linestyle(), drawn.get_marker(), drawn.get_color()))
        assert len({s[:2] for s in styles}) == 2, "a line style and marker per batch"
        assert len({s[2] for s in styles}) == 1, "one colour per size"


def test_a_diverged_trial_reads_as_worse_in_the_trial_table(sweep_dir, tmp_path):
    """Each size's top LR diverged: the table says it counts as worse (the optima judge it so),
    not "-", and its title says a diverged trial counts as worse too."""
    sweep = shutil.copytree(sweep_dir, tmp_path / "sweep")
    console = Console(file=StringIO(), width=400, markup=False)
    report_experiment(sweep, console=console)
    text = console.file.getvalue()
    rows = [ln for ln in text.splitlines() if "diverged at 41" in ln]
    assert len(rows) == 4 and all("worse (diverged)" in row for row in rows)
    assert "; one stopped before it or diverged counts as worse" in " ".join(text.split())
