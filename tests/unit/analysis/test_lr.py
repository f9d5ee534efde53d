"""Analysis on synthetic experiment dirs written to disk from known scaling-law constants."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from synthetic_experiments import (
    SWEEP_B,
    SWEEP_N,
    true_lr,
)

from trainer_core.analysis import (
    LADDER_LR_EXPONENT,
    AnalysisError,
    fit_lr_power_law,
    fit_sweep_lr,
    load,
    lr_sweep_table,
    optimal_lr,
    optimal_lrs,
)


def test_lr_sweep_table(sweep_dir: Path):
    res = load(sweep_dir)
    assert res.is_lr_sweep
    table = lr_sweep_table(res)
    assert len(table) == 7 * len(SWEEP_N)
    a = table[table["size"] == "a"].reset_index(drop=True)
    assert list(a["lr"]) == sorted(a["lr"])
    top, bottom = a.iloc[-1], a.iloc[0]
    assert top["diverged"] and top["diverged_step"] == 41 and top["status"] == "diverged"
    assert bottom["stopped_early"] and bottom["steps_run"] == 50 and not bottom["diverged"]
    mid = a.iloc[3]
    assert mid["steps_run"] == 100 and mid["final_eval_loss"] < mid["best_eval_loss"] + 1e-12
    assert mid["final_eval_loss"] == pytest.approx(mid["best_eval_loss"])
    # Compared at step 100, the end the trials early stopping let run reached; the one it
    # stopped at step 50 counts as worse (its loss there is not set beside their final ones),
    # the diverged one is left out.
    assert a["compared_step"].isna().tolist() == [True] + [False] * 6
    assert set(a["compared_step"].dropna()) == {100}
    assert mid["compared_loss"] == pytest.approx(mid["final_eval_loss"])
    assert bottom["compared_loss"] == math.inf and math.isnan(top["compared_loss"])


def test_optimal_lr_interior_quadratic_and_diverged_excluded(sweep_dir: Path):
    table = lr_sweep_table(load(sweep_dir))
    optima = optimal_lrs(table)
    assert list(optima) == list(SWEEP_N)
    for size, n in SWEEP_N.items():
        opt = optima[size]
        assert opt.method == "quadratic" and not opt.at_edge
        # the diverged trial's spurious 0.5 loss would otherwise be the minimum
        assert opt.lr == pytest.approx(true_lr(n), rel=1e-5)
        assert opt.step == 100
        assert opt.loss == pytest.approx(3.0 + 10 / math.log(n), rel=1e-5)
        # noise-free losses: the refits' vertices are the estimate itself
        assert opt.lr_low == pytest.approx(opt.lr) and opt.lr_high == pytest.approx(opt.lr)
        assert "(95% " in str(opt)


def test_optimal_lr_falls_back_to_grid_minimum_on_monotone_table():
    lrs = [1e-4, 2e-4, 4e-4, 8e-4]
    table = pd.DataFrame(
        {
            "size": "x",
            "N": 1e6,
            "lr": lrs,
            "final_eval_loss": [4.0, 3.9, 3.6, 3.1],  # concave: no usable quadratic
            "diverged": False,
        }
    )
    opt = optimal_lr(table, loss="final_eval_loss")
    assert (opt.method, opt.loss, opt.at_edge) == ("grid", 3.1, True)
    # worded as a law's cell at the edge is (CellOptimum): one flag for one kind of optimum
    assert str(opt).endswith("  NOT BRACKETED: lowest loss at the grid's largest lr; widen it")
    assert opt.lr == pytest.approx(8e-4)
    # a bound: from the LR below to beyond the grid
    assert opt.lr_low == pytest.approx(4e-4) and opt.lr_high == math.inf
    with pytest.raises(AnalysisError, match="no non-diverged trial"):
        optimal_lr(table.assign(diverged=True), loss="final_eval_loss")
    # a size whose every trial diverged is left out of the per-size optima
    dead = table.assign(size="y", N=4e6, diverged=True)
    assert list(optimal_lrs(pd.concat([table, dead]), loss="final_eval_loss")) == ["x"]


def test_lr_power_law_recovers_exponent_and_compares_to_ladder_default(sweep_dir: Path):
    n = np.array([1e6, 4e6, 1.6e7, 6.4e7, 2.56e8])
    wiggle = np.exp(0.03 * np.array([1, -1, 1, -1, 1]))
    fit = fit_lr_power_law(n, [true_lr(x) for x in n] * wiggle)
    assert fit.b == pytest.approx(SWEEP_B, abs=0.02)
    assert 0 < fit.b_stderr < 0.02
    assert fit.sigmas_from_reference == pytest.approx((fit.b - LADDER_LR_EXPONENT) / fit.b_stderr)
    assert fit.sigmas_from_reference < -3  # -0.4 is clearly steeper than -1/3 here
    assert "the ladder's default rule" in str(fit) and "3 dof" in str(fit)
    # Student's t with 3 dof, not the normal: the same t is less surprising.
    assert fit.p_from_reference == pytest.approx(
        2 * scipy.stats.t.sf(abs(fit.sigmas_from_reference), 3), rel=1e-4
    )
    assert fit.p_from_reference > 2 * scipy.stats.norm.sf(abs(fit.sigmas_from_reference))
    low, high = fit.interval(8e6)
    assert low < true_lr(8e6) < high and high / low < 1.2
    assert not fit.outside(8e6) and fit.outside(1e9)
    from trainer_core.ladder.formulas import LRFormula

    assert LRFormula().exponent == LADDER_LR_EXPONENT
    swept = fit_sweep_lr(sweep_dir)
    assert swept.b == pytest.approx(SWEEP_B, abs=1e-6)
    assert swept.predict(8e6) == pytest.approx(true_lr(8e6), rel=1e-5)
    with pytest.raises(AnalysisError, match=">= 2 sizes"):
        fit_lr_power_law([1e6, 1e6], [1e-3, 2e-3])


def test_lr_of_n_leaves_out_sizes_whose_optimum_the_grid_does_not_bracket(sweep_dir, tmp_path):
    """An optimum at a grid's edge is a bound: fitted as a point it pulled LR*(N)'s exponent
    (and the ladder's LR) with it."""
    import shutil

    cut = tmp_path / "sweep"
    shutil.copytree(sweep_dir, cut)

    def keep_only_lrs_above_the_optimum(size: str) -> None:
        for run in (cut / "runs").glob(f"{size}-lr*"):
            if float(run.name.split("-lr")[1]) < true_lr(SWEEP_N[size]):
                shutil.rmtree(run)

    keep_only_lrs_above_the_optimum("d")
    fit = fit_sweep_lr(cut)
    assert fit.n_points == 3 and fit.n_range == (SWEEP_N["a"], SWEEP_N["c"])
    assert fit.left_out == ("d",) and fit.left_out_note.startswith("lr*(N) leaves out d: ")
    assert fit.b == pytest.approx(SWEEP_B, abs=1e-4)
    keep_only_lrs_above_the_optimum("c")
    keep_only_lrs_above_the_optimum("b")
    with pytest.raises(AnalysisError, match=r"got 1: the best LR of b, c, d is at its grid's edge"):
        fit_sweep_lr(cut)


# -- plots and the CLI ---------------------------------------------------------------------------


def test_ladder_takes_its_lr_from_a_sweep(sweep_dir: Path, tmp_path: Path):
    from trainer_core.config.loader import from_dict
    from trainer_core.ladder.config import LadderConfig
    from trainer_core.ladder.lr_feedback import sweep_rules
    from trainer_core.ladder.plan import plan_ladder

    ladder = from_dict(
        LadderConfig,
        {"dir": str(tmp_path), "lr": {"from_sweep": str(sweep_dir)}, "sizes": ["1M", "3M"]},
    )
    fit = fit_sweep_lr(sweep_dir)
    plans = plan_ladder(ladder, rules=sweep_rules(ladder))
    for plan in plans:
        assert plan.lr == pytest.approx(fit.predict(plan.num_params))
        assert plan.lr_source == f"sweep {sweep_dir}"
        cfg = plan.config
        assert cfg.optim.lr == pytest.approx(plan.lr)
        assert f"lr_source=sweep {sweep_dir}" in cfg.tracking.tags
    bad = from_dict(LadderConfig, {"lr": {"from_sweep": str(tmp_path / "nope")}})
    from trainer_core.config.loader import ConfigError

    with pytest.raises(ConfigError, match="lr.from_sweep: .*nope.* can't give an LR fit"):
        sweep_rules(bad)


def test_a_ladder_dir_is_no_lr_sweep(ladder_dir: Path):
    """One LR per size brackets nothing: lr*(N) from a ladder would be the ladder's own LR rule
    fitted back, with an interval of zero width."""
    one = optimal_lr(lr_sweep_table(load(ladder_dir)).query("size == 's1'"))
    assert one.at_edge and one.n_trials == 1
    with pytest.raises(
        AnalysisError, match=r"is a ladder, not an LR sweep: each size trained at one LR"
    ):
        fit_sweep_lr(ladder_dir)


def test_every_batch_of_a_group_is_compared_and_named_in_tokens(tmp_path):
    """Batches 16x apart reach the common tokens at steps rounded to their own batch: a window
    of two small batches left the small-batch trials out (14 of 105 trials of this sweep)."""
    from synthetic_hparams import make_hparam_sweep

    sweep = make_hparam_sweep(tmp_path / "sweep", {"s": 1_000_000, "m": 4_000_000})
    table = lr_sweep_table(load(sweep))
    assert table["batch"].max() / table["batch"].min() > 15
    assert table["compared_loss"].notna().all()
    best = optimal_lrs(table)["s"]
    assert " tokens (" in str(best) and "at step" not in str(best)


def test_a_trial_stopped_one_eval_short_of_the_end_is_judged_worse(tmp_path):
    """One batch for the whole group: every trial evaluates at the same tokens, so there is no
    rounding to allow for, and a trial early stopping cut at step 99 of 100 has not reached the
    end (it was compared at 99 beside the others' 100 when the batch-rounding slack applied)."""
    from synthetic_experiments import BATCH, write_jsonl, write_run

    (tmp_path / "experiment.yaml").write_text("name: sweep\nsweep: {search: grid}\n")
    for lr, last, status in (
        (1e-3, 100, "finished"),
        (2e-3, 100, "finished"),
        (4e-3, 99, "stopped"),
    ):
        run = tmp_path / "runs" / f"a-lr{lr:g}"
        write_run(run, size="a", n=1_000_000, lr=lr, total_steps=100, status=status, last_step=last)
        write_jsonl(
            run / "metrics.jsonl",
            [{"step": s, "tokens": s * BATCH, "eval/loss": 3.0 - lr} for s in range(97, last + 1)],
        )
    table = lr_sweep_table(load(tmp_path)).sort_values("lr")
    assert table["compared_step"].tolist() == [100, 100, pd.NA]
    assert table["compared_loss"].tolist()[2] == math.inf


def _centred_sweep(root: Path, sizes: dict[str, int]) -> Path:
    """ASHA's usual outcome on a grid centred on a rule: per size the rule's LR finishes and
    its neighbours (x0.5, x2) are stopped, so each size's LR* is the rule's own LR."""
    from synthetic_experiments import BATCH, write_jsonl, write_run

    (root / "experiment.yaml").write_text("name: sweep\nsweep: {search: grid}\n")
    for size, n in sizes.items():
        for factor in (0.5, 1.0, 2.0):
            lr = 6.9e-4 * (n / 1e6) ** -0.67 * factor
            finished = factor == 1.0
            last = 100 if finished else 50
            run = root / "runs" / f"{size}-lr{lr:.3e}"
            status = "finished" if finished else "stopped"
            write_run(run, size=size, n=n, lr=lr, total_steps=100, status=status, last_step=last)
            evals = [{"step": s, "tokens": s * BATCH, "eval/loss": 2.0} for s in (50, last)]
            write_jsonl(run / "metrics.jsonl", evals)
    return root


CENTRED_N = {"25K": 37_088, "50K": 70_000, "100K": 140_000}


def test_lr_of_n_through_grid_picks_keeps_their_intervals_and_says_so(tmp_path: Path):
    """Every optimum the grid's centre: the three lie exactly on the rule's line, and the law
    was printed as b = -0.670 ± 0.000 (t = -3.6e14) with a plan interval of zero width. Each
    size's own interval (its neighbouring LRs) now carries through to the law."""
    from trainer_core.analysis.hparam_laws import Z_CI

    fit = fit_sweep_lr(_centred_sweep(tmp_path, CENTRED_N))
    assert fit.b == pytest.approx(-0.67, abs=1e-4)
    sigma = math.log(4) / (2 * Z_CI)  # each size's 95% interval: x0.5 .. x2 about its LR*
    x = np.log(list(CENTRED_N.values()))
    sxx = float(np.sum((x - x.mean()) ** 2))
    assert fit.b_stderr >= sigma / math.sqrt(sxx) * (1 - 1e-9)
    low, high = fit.interval(1e6)
    implied = Z_CI * sigma * math.sqrt(1 / 3 + (math.log(1e6) - x.mean()) ** 2 / sxx)
    assert math.log(high / low) / 2 >= implied * (1 - 1e-9)
    assert low < fit.predict(1e6) < high
    text = str(fit)
    assert "± 0.000" not in text and "scale: the sizes' own intervals" in text
    assert "GRID PICKS: every size's LR* is a grid point" in text
    assert "refine the grid around it (more LRs per size)" in text


def test_lr_of_n_from_two_sizes_has_the_interval_their_optima_give(tmp_path: Path):
    """Two sizes leave no residual to scale by: the law had no interval, and the plan printed
    'no interval' without a word why. The sizes' own intervals give it one."""
    two = {size: CENTRED_N[size] for size in ("25K", "100K")}
    fit = fit_sweep_lr(_centred_sweep(tmp_path, two))
    assert fit.n_points == 2 and fit.dof == 0
    low, high = fit.interval(1e6)
    assert 0 < low < fit.predict(1e6) < high < math.inf
    assert math.isfinite(fit.b_stderr) and fit.b_stderr > 0.1
    assert "2 sizes: no scatter to check them" in str(fit)


def test_lr_of_n_without_the_sizes_intervals_takes_its_interval_from_the_scatter_alone():
    """No interval given: each optimum was taken as known to 2%, so two sizes 'differed' from
    OLMo's -1/3 at p = 0.0085. The scatter alone sets the interval; two sizes have none."""
    two = fit_lr_power_law([1e6, 1e7], [1e-3, 5e-4])
    assert math.isnan(two.b_stderr) and all(map(math.isnan, two.interval(3e6)))
    assert "(no interval: 2 sizes" in str(two) and "p =" not in str(two)
    n = np.array([1e6, 3e6, 1e7, 3e7])
    lr = 1e-3 * (n / 1e6) ** -0.4 * np.array([1.05, 0.95, 1.04, 0.97])
    three = fit_lr_power_law(n, lr)
    x, y = np.log(n), np.log(lr)
    ols = np.polyfit(x, y, 1, cov=True)[1]
    assert three.t_dof == 2 and three.b_stderr == pytest.approx(math.sqrt(ols[0, 0]), rel=1e-5)
