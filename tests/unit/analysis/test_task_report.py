"""A ladder's task evals read by load() and reported: the held-out size's two-step prediction."""

from __future__ import annotations

import math
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from support.synthetic_experiments import (
    BATCH,
    FRACTIONS,
    LADDER_N,
    TASK,
    TASK_TRUTH,
    is_png,
    make_ladder,
    task_metrics,
)

from trainer_core.analysis import load, report_experiment
from trainer_core.analysis.report_data import Report
from trainer_core.analysis.report_tasks import task_section, task_table

BOOT = 20


@pytest.fixture(scope="module")
def task_ladder(tmp_path_factory) -> Path:
    return make_ladder(tmp_path_factory.mktemp("ladder"), task=True)


def test_load_gives_every_eval_of_every_task(task_ladder: Path):
    results = load(task_ladder)
    assert results.task_names == [TASK]
    assert results.task_chances() == {TASK: TASK_TRUTH.chance}
    tasks = results.tasks
    # four annealed evals and one pre-decay eval per size
    assert len(tasks) == 5 * len(LADDER_N) and tasks["annealed"].sum() == 4 * len(LADDER_N)
    assert {f"{TASK}/{m}" for m in ("acc", "acc_norm", "bpb", "chance")} <= set(tasks.columns)
    points = results.task_points()
    assert len(points) == 4 * len(LADDER_N) and points["annealed"].all()
    last = points[points["size"] == "s6"].iloc[-1]
    n = LADDER_N["s6"]
    assert last[f"{TASK}/bpb"] == pytest.approx(
        task_metrics(n, last["tokens"])[f"task/{TASK}/bpb"], rel=2e-3
    )
    assert not any(c.startswith(TASK) for c in results.metrics.columns)


def test_task_fits_take_the_checkpoints_the_loss_fit_takes(task_ladder: Path, tmp_path: Path):
    """A metrics.jsonl eval at a low LR (a cosine run's second half) was read as a finished
    run's point by the task fits, while the loss fit took the annealed checkpoints alone."""
    import json
    import shutil

    ladder = tmp_path / "ladder"
    shutil.copytree(task_ladder, ladder)
    run = ladder / "runs" / "s6"
    peak = json.loads((run / "run.json").read_text())["peak_lr"]
    before = load(ladder).task_points()
    mid = {"step": 7, "tokens": 7 * BATCH, "lr": 0.3 * peak, "eval/loss": 3.0}
    mid.update(task_metrics(LADDER_N["s6"], 7 * BATCH))
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(mid) + "\n")
    results = load(ladder)
    assert results.tasks["step"].eq(7).any()
    after = results.task_points()
    assert len(after) == len(before) and not after["step"].eq(7).any()


def test_a_ladder_without_tasks_has_none(ladder_dir: Path):
    results = load(ladder_dir)
    assert results.task_names == [] and results.tasks.empty


def test_task_section_prints_the_held_out_prediction(task_ladder: Path, tmp_path: Path):
    text = StringIO()
    report = Report(load(task_ladder), tmp_path)
    task_section(report, Console(file=text, width=200), BOOT)
    (pred,) = report.task_holdout.predictions
    steps = round(80 * LADDER_N["s6"] / BATCH)
    assert (pred.task, pred.N, pred.D) == (
        TASK,
        LADDER_N["s6"],
        round(FRACTIONS[-1] * steps) * BATCH,
    )
    # known answer: the truth is a power law and a sigmoid, the noise 0.1% in the task loss
    truth = float(TASK_TRUTH.acc(pred.N, pred.D))
    assert pred.acc == pytest.approx(truth, abs=0.01)
    assert pred.measured_acc == pytest.approx(truth, abs=0.01)
    lo, hi = pred.acc_interval
    assert lo <= pred.acc <= hi and math.isfinite(lo) and hi - lo < 0.05
    out = text.getvalue()
    assert "held out s6" in out and "downstream tasks" in out
    assert f"{pred.acc:6.3f} [{lo:.3f}, {hi:.3f}]  {pred.measured_loss:7.4f}" in out
    assert is_png(tmp_path / f"task_{TASK}.png")


def test_the_table_shows_each_accuracy_measured_and_the_fit_names_its_own(
    task_ladder: Path, tmp_path: Path
):
    """A calibrated accuracy in the runs' records gets its own column, and the held-out table
    says which accuracy step 2 fitted: ``auto`` takes acc_pmi, ``--task-accuracy`` another."""
    results = load(task_ladder)
    points = results.task_points()

    def shown(table) -> str:
        text = StringIO()
        Console(file=text, width=200).print(table)
        return text.getvalue()

    assert "acc_pmi" not in shown(task_table(points, [TASK]))
    results.tasks[f"{TASK}/acc_pmi"] = results.tasks[f"{TASK}/acc"] + 0.05
    assert "acc_pmi" in shown(task_table(results.task_points(), [TASK]))
    for wanted, fitted in (("auto", "acc_pmi"), ("acc_norm", "acc_norm")):
        report = Report(results, tmp_path)
        task_section(report, Console(file=StringIO()), BOOT, wanted)
        (pred,) = report.task_holdout.predictions
        assert pred.accuracy == fitted and report.task_holdout.laws[TASK].accuracy == fitted


def test_a_ladder_of_too_few_sizes_says_why_it_has_no_prediction(tmp_path: Path):
    three = {k: LADDER_N[k] for k in ("s1", "s2", "s3")}
    report = Report(load(make_ladder(tmp_path / "exp", sizes=three, task=True)), tmp_path)
    task_section(report, Console(file=StringIO()), BOOT)
    assert report.task_holdout is None
    assert any("held-out task prediction" in s and ">= 3 sizes" in s for s in report.skipped)


@pytest.mark.slow
def test_the_ladder_report_ends_with_the_task_prediction(task_ladder: Path, tmp_path: Path):
    text = StringIO()
    report = report_experiment(
        task_ladder, tmp_path, n_bootstrap=BOOT, console=Console(file=text, width=200)
    )
    assert report.task_holdout is not None
    assert "held out s6 (N=2e+08): predicted vs measured" in text.getvalue()
    assert tmp_path / f"task_{TASK}.png" in report.plots


@pytest.mark.slow
def test_a_report_without_bootstrap_draws_the_task_plot_and_writes_report_txt(
    task_ladder: Path, tmp_path: Path
):
    """``--bootstrap 0``: the task plot's axis took the intervals' lows, none there (a
    TypeError), and a measured accuracy was called a MISS of the interval [nan, nan]. The
    printed report lands in report.txt too."""
    out = tmp_path / "out"
    report = report_experiment(task_ladder, out, n_bootstrap=0)
    assert out / f"task_{TASK}.png" in report.plots
    text = (out / "report.txt").read_text()
    assert "held out s6 (N=2e+08): predicted vs measured" in text and "MISS" not in text
    assert text.rstrip().endswith(str(out / "report.txt"))
