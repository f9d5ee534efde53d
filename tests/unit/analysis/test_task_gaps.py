"""Task fits on what a real ladder leaves: a task missing at some sizes or points, a step 1
without a bootstrap, a ladder of four sizes, a ladder table with its examples and chance."""

from __future__ import annotations

import functools
import math
import re
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from support.synthetic_experiments import LADDER_N, TASK, TASK_TRUTH, make_ladder

from trainer_core.analysis import load
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.ladder_table import read_ladder_table
from trainer_core.analysis.report_data import Report
from trainer_core.analysis.report_tasks import task_section
from trainer_core.analysis.synthetic_tasks import TaskTruth, task_ladder
from trainer_core.analysis.tasks import (
    NO_STEP1_INTERVAL,
    TaskReport,
    fit_task,
    predict_tasks,
    task_holdout_check,
)

BOOT = 20
TRUTH = TaskTruth(ceiling=1.0)
METRICS = ("bpb", "acc", "acc_norm", "chance")


@pytest.fixture(scope="module")
def ladder(tmp_path_factory) -> Path:
    return make_ladder(tmp_path_factory.mktemp("ladder"), task=True)


def table(tmp_path: Path, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` written as a ladder table and read back, as a table user's points are."""
    path = tmp_path / "ladder.csv"
    frame.to_csv(path, index=False)
    return read_ladder_table(path, loss=None)


def test_a_task_missing_at_one_size_costs_no_task_its_prediction(ladder: Path, tmp_path: Path):
    """``late`` was added to the evals after s1 ran, ``rare`` after s4: the report's held-out
    prediction was skipped for every task with "fit_chinchilla: every value of L must be a
    positive finite number", naming neither task nor size. Now ``late`` is fitted without s1,
    flagged, ``rare`` (one size left below the held-out one) is skipped alone, naming itself,
    and ``synth`` keeps its prediction."""
    results = load(ladder)
    tasks = results.tasks
    for task, since in (("late", "s2"), ("rare", "s5")):
        scored = tasks["N"] >= LADDER_N[since]
        for metric in METRICS:
            tasks[f"{task}/{metric}"] = tasks[f"{TASK}/{metric}"].where(scored)
    assert results.task_names == [TASK, "late", "rare"]
    report, text = Report(results, tmp_path), StringIO()
    task_section(report, Console(file=text, width=250), BOOT)
    held = report.task_holdout
    assert held is not None
    by_task = {p.task: p for p in held.predictions}
    assert set(by_task) == {TASK, "late"}
    assert by_task["late"].acc == pytest.approx(by_task[TASK].acc, abs=0.01)
    gap = "MISSING: no finite late/bpb / late/acc at s1 (every point): both steps fitted"
    assert any(f.startswith(gap) for f in held.laws["late"].flags)
    assert not any(f.startswith("MISSING") for f in held.laws[TASK].flags)
    (skipped,) = held.skipped
    assert skipped.startswith("task 'rare': fit_chinchilla needs >= 5 points, got 4")
    assert "s1 (every point), s2 (every point), s3 (every point), s4 (every point)" in skipped
    assert report.skipped == [f"held-out task prediction: {skipped}"]
    out = text.getvalue()
    assert f"late, {gap}" in out and f"skipped {skipped}" in out


def test_a_nan_task_loss_at_one_point_leaves_out_that_point(tmp_path: Path):
    """One failed eval (a NaN task loss) made the whole task unfittable; now the fit is the one
    without that point, and its flag says where the point was."""
    points = table(tmp_path, task_ladder(TRUTH, seed=2))
    row = points.index[(points["N"] == 5e7)][5]
    gappy = points.copy()
    gappy.loc[row, "synth/bpb"] = math.nan
    law = fit_task(gappy, "synth", TRUTH.chance, n_bootstrap=0)
    without = fit_task(points.drop(index=row), "synth", TRUTH.chance, n_bootstrap=0)
    assert law.predict(4e9, 8e10).acc == pytest.approx(without.predict(4e9, 8e10).acc, rel=1e-4)
    size = points.loc[row, "size"]
    assert law.flags[0] == (
        f"MISSING: no finite synth/bpb / synth/acc at {size} (1 of 16 points): both steps "
        "fitted without those points"
    )


def test_a_task_that_cannot_be_fitted_is_skipped_alone(tmp_path: Path):
    """A task scored by one size only: its own line says why; every other task is predicted;
    with no task left, one error gives each task's reason."""
    points = table(tmp_path, task_ladder(TRUTH, seed=1))
    points["rare/bpb"] = points["synth/bpb"].where(points["N"] == 2e8)
    points["rare/acc"] = points["synth/acc"]
    chances = {"synth": TRUTH.chance, "rare": TRUTH.chance}
    report = predict_tasks(points, chances, 7e9, 2e12, n_bootstrap=0)
    assert [p.task for p in report.predictions] == ["synth"]
    (why,) = report.skipped
    assert why.startswith("task 'rare': fit_chinchilla needs >= 5 points, got 4 (no finite")
    assert f"skipped {why}" in str(report)
    with pytest.raises(AnalysisError, match=r"^task 'rare': .*; task 'gone': .*no column gone/bpb"):
        predict_tasks(points, {"rare": 0.25, "gone": 0.25}, 7e9, 2e12, n_bootstrap=0)


def test_no_step1_bootstrap_gives_no_accuracy_interval(tmp_path: Path):
    """Five step-1 points for five parameters leave step 1 without refits: the accuracy's
    "95% interval" was step 2's spread alone, [0.799, 0.813] around a task loss whose own
    interval was [nan, nan]. Now there is none, and the report says why."""
    frame = task_ladder(TRUTH, seed=0, sizes=(5e7, 1e8, 2e8))
    runs = ["5e+07-1xC", "5e+07-2xC", "1e+08-1xC", "1e+08-5xC", "2e+08-10xC"]
    points = table(tmp_path, frame[frame["run"].isin(runs)])
    law = fit_task(points, "synth", TRUTH.chance, n_bootstrap=BOOT)
    assert law.step1.n_bootstrap == 0 and law.step2.n_bootstrap == BOOT
    assert any("no 95% intervals" in f for f in law.flags)
    n, d = 4e8, 8e9
    pred = law.predict(n, d, "4e8", float(TRUTH.loss(n, d)), float(TRUTH.acc(n, d)), 400)
    assert all(map(math.isnan, (*pred.loss_interval, *pred.acc_interval)))
    text = str(TaskReport([pred]))
    assert f"synth, {NO_STEP1_INTERVAL}" in text and "MISS" not in text
    assert fit_task(points, "synth", TRUTH.chance, n_bootstrap=0).predict(n, d).no_interval == ""


def test_fit_task_by_default_fits_a_ladder_as_the_report_does(tmp_path: Path):
    """On a 4-size ladder the Python call failed "fit_chinchilla needs >= 5 points, got 4" (each
    run's last eval only) where the report, fitting every annealed eval, worked: the default
    is now the report's for a ladder's annealed evals, and each run's last for a table."""
    four = {k: LADDER_N[k] for k in ("s1", "s2", "s3", "s4")}
    results = load(make_ladder(tmp_path / "exp", sizes=four, task=True))
    points = results.task_points()
    law = fit_task(points, TASK, TASK_TRUTH.chance, n_bootstrap=0)
    every = fit_task(points, TASK, TASK_TRUTH.chance, n_bootstrap=0, final_only=False)
    assert not law.final_only and law.step1.n_points == len(points) == 16
    assert law.predict_loss(1e9, 2e10) == pytest.approx(every.predict_loss(1e9, 2e10), rel=1e-4)
    with pytest.raises(AnalysisError, match="needs >= 5 points, got 4"):
        fit_task(points, TASK, TASK_TRUTH.chance, n_bootstrap=0, final_only=True)
    published = table(tmp_path, task_ladder(TRUTH, seed=1))
    assert fit_task(published, "synth", TRUTH.chance, n_bootstrap=0).step1.n_points == 20


def test_the_docs_python_line_predicts_every_task(
    ladder: Path, repo_root: Path, capsys, monkeypatch
):
    """docs/tasks.md's Python block, run on a ladder (with fewer refits, for time): it prints
    each task's prediction."""
    import trainer_core.analysis

    monkeypatch.setattr(
        trainer_core.analysis, "predict_tasks", functools.partial(predict_tasks, n_bootstrap=BOOT)
    )
    docs = (repo_root / "docs" / "tasks.md").read_text()
    analysis = docs.split("## In the analysis", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", analysis.split("\n## ", 1)[0], re.S)
    assert "predict_tasks(r.task_points(), r.task_chances()" in block
    exec(block.replace('"experiments/my_ladder"', repr(str(ladder))), {})
    out = capsys.readouterr().out
    assert "two-step task prediction at N=7e+09, D=2e+12" in out
    (row,) = [line for line in out.splitlines() if line.startswith(f"{TASK} ")]
    acc = float(row.split()[6])
    assert acc == pytest.approx(float(TASK_TRUTH.acc(7e9, 2e12)), abs=0.02)


def test_a_table_keeps_examples_and_chance_for_the_held_out_noise(tmp_path: Path):
    """A table's ``<task>/examples`` was dropped on reading, so its held-out intervals silently
    lacked the measurement's binomial noise: now it and ``<task>/chance`` survive the round trip
    and the intervals are for a score on that many examples."""
    frame = task_ladder(TRUTH, seed=1)
    frame["synth/examples"], frame["synth/chance"] = 200, TRUTH.chance
    points = table(tmp_path, frame)
    assert (points["synth/examples"] == 200).all()
    assert (points["synth/chance"] == TRUTH.chance).all()
    report = task_holdout_check(points, {"synth": TRUTH.chance}, n_bootstrap=BOOT)
    assert {p.examples for p in report.predictions} == {200}
    assert "score on 200 examples" in str(report)
    for column, bad, what in (
        ("synth/examples", 2.5, "a whole number of examples >= 1"),
        ("synth/examples", 0, "a whole number of examples >= 1"),
        ("synth/chance", 1.0, "a chance accuracy between 0 and 1"),
    ):
        broken = frame.copy()
        broken[column] = broken[column].astype(float)
        broken.loc[3, column] = bad
        with pytest.raises(AnalysisError, match=rf"line 5: column {column} is .*, not {what}"):
            table(tmp_path, broken)
