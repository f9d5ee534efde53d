"""The whole answer at a target compute: N*, D*, loss, LR*, B* and device-hours, one table."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic_experiments import make_ladder
from synthetic_hparams import make_hparam_sweep

from trainer_core.analysis import (
    AnalysisError,
    TargetSettings,
    device_cost,
    fit_hparam_laws,
    report_experiment,
    target_answer,
)
from trainer_core.analysis.fits import ChinchillaFit
from trainer_core.analysis.frontier import fit_frontier
from trainer_core.analysis.isoflop import IsoFLOPFit
from trainer_core.analysis.predict import chinchilla_from_points
from trainer_core.analysis.synthetic import SyntheticLadder
from trainer_core.analysis.synthetic_sweep import PlantedLaw, SyntheticSweep
from trainer_core.analysis.target import FlopsPerToken, LawSources, SweepLaws
from trainer_core.ladder.lr_feedback import SweepRules

C = 6e20
"""With A = B and alpha = beta, N* = D* = sqrt(C / 6) = 1e10."""
LR_AT_TARGET = PlantedLaw(1e-3 * 1e10**0.406, -0.713, 0.307)
"""Step Law's exponents, scaled so that LR*(1e10, 1e10) = 1e-3."""
BATCH_AT_TARGET = PlantedLaw(1e6 / 1e10**0.571, 0.0, 0.571)
"""B*(1e10 tokens) = 1e6 tokens."""


def symmetric_law() -> ChinchillaFit:
    return ChinchillaFit(n_points=8, objective=0.0, E=1.7, A=400.0, B=400.0, alpha=0.3, beta=0.3)


def test_target_table_by_hand():
    sweep = SyntheticSweep(lr_law=LR_AT_TARGET, batch_law=BATCH_AT_TARGET, noise=0.0)
    fitted = fit_hparam_laws(sweep.table(), n_bootstrap=200)
    laws = SweepLaws(SweepRules(lr_law=fitted.lr, batch_law=fitted.batch))
    answer = target_answer(C, device_cost("H100", 0.5), chinchilla=symmetric_law(), laws=laws)
    (col,) = answer.columns
    assert col.N[0] == pytest.approx(1e10) and col.D[0] == pytest.approx(1e10)
    lr, lo, hi = col.lr
    assert lr == pytest.approx(1e-3, rel=1e-3) and lo < 1e-3 < hi
    batch, blo, bhi = col.batch
    assert batch == pytest.approx(1e6, rel=1e-3) and blo < 1e6 < bhi
    assert col.flops == pytest.approx(6e20)
    # laws fitted, but no column with an N_opt and D_opt to read them at
    bare = target_answer(C, device_cost("cpu"), laws=laws, hparam_source="/s")
    assert "lr*, B*: the laws of /s, but no column has the N_opt and D_opt" in bare.footer()[1]
    # 6e20 FLOPs / (989e12 FLOP/s x 0.5) = 1,213,347 s = 337.04 h
    assert col.device_hours == pytest.approx(337.04, rel=1e-4)
    text = str(answer)
    assert text.startswith("compute-optimal at C = 6e+20 FLOPs")
    assert "H100, 9.89e+14 FLOP/s peak, 50% MFU (assumed), FLOPs = 6 N D" in text
    assert (
        "lr*, B*: the laws of the sweep, read at each column's N_opt, D_opt, as a ladder's plan "
        "fits them (lr.from_sweep, batch.from_sweep with batch.sweep_law: D;"
    ) in text
    assert "extrapolated (N, D/N outside the sweep's cells)" in text  # 1 token a parameter
    assert [c.approach for c in answer.columns] == ["approach 3 (L(N, D))"]
    rows = dict(answer.rows())
    assert rows["device-hours"] == ["337"] and rows["lr*"][0].startswith("0.001 [")


def test_a_degenerate_isoflop_slope_gives_no_compute_optimal_size():
    """The demo's approach 2 once came out at a = 1.05 (flagged DEGENERATE) and the answer table
    still carried it to the target: an N_opt 20x approach 3's, priced in device-hours."""
    healthy = IsoFLOPFit(a=0.5, log_k=float(np.log(1 / np.sqrt(6))), parabolas=[])
    (col,) = target_answer(C, device_cost("cpu"), isoflop=healthy).columns
    assert col.N[0] == pytest.approx(1e10) and col.D[0] == pytest.approx(1e10)
    degenerate = replace(healthy, a=1.05)
    answer = target_answer(C, device_cost("cpu"), isoflop=degenerate)
    rows = dict(answer.rows())
    assert rows["a: N_opt ~ C^a"] == ["1.050"]
    for label in ("N_opt", "D_opt (tokens)", "FLOPs priced", "device-hours"):
        assert rows[label] == ["-"], label
    assert (
        "approach 2: no N_opt, D_opt: its a = 1.05 splits no compute between N and D "
        "(the isoFLOP fit's DEGENERATE line)"
    ) in answer.footer()


def test_device_hours_count_attention_as_the_runs_did():
    """The runs (and the planner, and the trainer's MFU) count attention's FLOPs; pricing 6 N D
    at that MFU came out 20-40% cheap at seq 4096. Attention's FLOPs per parameter, fitted over
    the runs' sizes, are carried to N_opt."""
    n = np.array([1e6, 4e6, 16e6])
    runs = pd.DataFrame({"num_params": n, "flops_per_token": 6 * n + 3.0 * n**0.75})
    per_token = FlopsPerToken.of_runs(runs)
    assert (per_token.coef, per_token.power) == pytest.approx((3.0, 0.25), rel=1e-4)
    cost = replace(device_cost("H100", 0.5), per_token=per_token)
    (col,) = target_answer(C, cost, chinchilla=symmetric_law()).columns
    flops = (6 * 1e10 + 3.0 * 1e10**0.75) * 1e10
    assert col.flops == pytest.approx(flops, rel=1e-4)
    assert col.device_hours == pytest.approx(flops / (989e12 * 0.5) / 3600, rel=1e-4)
    assert "FLOPs = 6 N D + attention (3 N^-0.25 per parameter-token" in str(cost)
    six = pd.DataFrame({"num_params": n, "flops_per_token": 6 * n})
    assert FlopsPerToken.of_runs(six)(1e10) == 6e10


def test_without_laws_the_rows_stay_empty_and_say_how_to_fill_them():
    answer = target_answer(C, device_cost("cpu"), chinchilla=symmetric_law())
    rows = dict(answer.rows())
    assert rows["lr*"] == ["-"] and rows["B* (tokens)"] == ["-"]
    assert "--hparam-sweep DIR" in str(answer)
    failed = target_answer(C, device_cost("cpu"), chinchilla=symmetric_law(), hparam_source="/s")
    assert "lr*, B*: no laws from /s (why: the skipped line below)" in failed.footer()
    with pytest.raises(AnalysisError, match="device 'TPU9': no peak FLOP/s known"):
        device_cost("TPU9")


def test_a_column_without_intervals_is_not_claimed_to_have_them():
    """A 2-size ladder's frontier has no resamples (no L(N, D) to draw them around): the table
    was headed "95% bootstrap intervals" over its bare loss, without a word."""
    two_sizes = SyntheticLadder(n_sizes=2, noise=0.0).points()
    frontier = fit_frontier(two_sizes, n_bootstrap=20)
    alone = target_answer(C, device_cost("cpu"), frontier=frontier)
    assert alone.title == "compute-optimal at C = 6e+20 FLOPs (no bootstrap intervals)"
    why = "frontier L(C): no 95% intervals (why: the UNRESOLVED line of its fit above)"
    assert why in alone.footer()
    chinchilla = chinchilla_from_points(SyntheticLadder(n_sizes=4).points(), n_bootstrap=10)
    both = target_answer(C, device_cost("cpu"), chinchilla=chinchilla, frontier=frontier)
    assert both.title == (
        "compute-optimal at C = 6e+20 FLOPs (95% bootstrap intervals, none for frontier L(C))"
    )
    assert why in both.footer() and "[" in dict(both.rows())["loss"][0]
    # none asked for: no column has any, and nothing more to say
    bare = target_answer(C, device_cost("cpu"), frontier=fit_frontier(two_sizes, 0))
    assert bare.title.endswith("(no bootstrap intervals)") and not bare.notes


def test_a_two_size_ladder_report_says_what_its_frontier_lacks(tmp_path: Path):
    """Refused, the frontier leaves no law and no target table (it printed its row labels alone,
    headed "95% bootstrap intervals"); fitted, it says beside itself and the table why it has no
    intervals."""
    from io import StringIO

    from rich.console import Console

    close = make_ladder(tmp_path / "close", sizes={"s1": 2_000_000, "s2": 3_000_000})
    console = Console(file=StringIO(), width=400)
    report = report_experiment(close, n_bootstrap=5, console=console)
    assert report.frontier is None and report.target is None
    assert "target table: no law was fitted (each fit's skipped line says why)" in report.skipped
    assert "compute-optimal" not in console.file.getvalue()
    assert (tmp_path / "close" / "analysis" / "loss_vs_compute.png").is_file()
    apart = make_ladder(tmp_path / "apart", sizes={"s1": 2_000_000, "s2": 5_000_000})
    console = Console(file=StringIO(), width=400)
    report = report_experiment(apart, n_bootstrap=5, console=console)
    text = console.file.getvalue()
    assert "  UNRESOLVED: no 95% intervals: the bootstrap redraws the points' noise" in text
    assert report.target.title.endswith("FLOPs (no bootstrap intervals)")
    assert (
        "frontier L(C): no 95% intervals (why: the UNRESOLVED line of its fit above)"
        in report.target.footer()
    )


def test_settings_default_to_the_experiment_record(tmp_path: Path):
    (tmp_path / "experiment.yaml").write_text(
        "device_type: A100\nassumed_mfu: 0.3\nlr: {from_sweep: /sweeps/one}\n"
    )
    cost, sweeps = TargetSettings().resolve(tmp_path)
    assert (cost.device, cost.peak_flops, cost.mfu) == ("A100", 312e12, 0.3)
    assert sweeps == LawSources("/sweeps/one", "/sweeps/one", "")
    other = tmp_path / "other"
    other.mkdir()
    (other / "experiment.yaml").write_text("sizes: [15K]\nsweep: {factors: [1.0]}\n")
    cost, sweeps = TargetSettings("H100", 0.5, str(other)).resolve(tmp_path)
    assert (cost.device, cost.mfu, sweeps.lr, sweeps.batch) == ("H100", 0.5, str(other), str(other))


def test_a_ladders_unknown_batch_sweep_law_is_refused_with_the_ladders_own_words(tmp_path: Path):
    """The check is BatchFormula's: the same list of laws, the record's path named."""
    (tmp_path / "experiment.yaml").write_text("batch: {from_sweep: /sweeps/one, sweep_law: N}\n")
    with pytest.raises(AnalysisError) as refused:
        TargetSettings().resolve(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'experiment.yaml'}: batch.sweep_law: 'N' is not allowed; use one of 'D', "
        "'N,D'"
    )


def test_a_bad_device_mfu_or_compute_is_refused_before_any_fit():
    """Settings are checked where they are made (analyze.py makes them before loading anything);
    a compute budget of 0 once fell back to the default target without a word."""
    with pytest.raises(AnalysisError, match="device 'TPU9': no peak FLOP/s known"):
        TargetSettings("TPU9")
    with pytest.raises(AnalysisError, match=r"MFU 1.5: must be in \(0, 1\]"):
        TargetSettings(mfu=1.5)
    with pytest.raises(AnalysisError, match="target compute C = 0.0: must be a positive finite"):
        target_answer(0.0, device_cost("cpu"), chinchilla=symmetric_law())


def test_analysis_imports_neither_torch_nor_ray():
    code = "import sys, trainer_core.analysis; print('torch' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_report_prints_the_target_table_with_the_sweep_laws(tmp_path: Path):
    ladder = make_ladder(tmp_path / "ladder")
    sizes = {"s1": 2_000_000, "s2": 5_000_000, "s3": 12_000_000, "s4": 30_000_000}
    sweep = make_hparam_sweep(tmp_path / "sweep", sizes)
    target = TargetSettings("H100", 0.4, str(sweep))
    report = report_experiment(
        ladder, tmp_path / "out", target_flops=1e21, n_bootstrap=5, target=target
    )
    col = next(c for c in report.target.columns if c.approach == "approach 3 (L(N, D))")
    N, D = col.N[0], col.D[0]
    truth = PlantedLaw(1.79, -0.713, 0.307)(N, D)
    assert col.lr[1] < truth < col.lr[2]
    assert col.device_hours == pytest.approx(6 * N * D / (989e12 * 0.4) / 3600)
