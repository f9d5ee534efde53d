"""Loading an experiment while it runs: before any decay has ended, and with a run starting."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
from synthetic_experiments import BATCH, make_ladder, write_jsonl, write_run

from trainer_core.analysis import AnalysisError, chinchilla_from_points, fit_frontier, load
from trainer_core.errors import RunWarning

FIT_COLUMNS = ["size", "name", "N", "peak_lr", "step", "tokens", "flops", "eval_loss"]
SIZES = {"s1": 2_000_000, "s2": 4_000_000}


def test_no_annealed_eval_gives_empty_points_with_their_columns(sweep_dir: Path, tmp_path: Path):
    """The filter on finite losses, on no rows, took its float mask for column labels: the
    frame lost every column and each fit died with a KeyError ('N', 'size') instead of saying
    it has too few points."""
    for i, n in enumerate(SIZES.values()):  # a ladder before its first decay
        run = tmp_path / "runs" / f"s{i}"
        write_run(run, size=f"s{i}", n=n, lr=1e-3, total_steps=100, status="running")
        write_jsonl(
            run / "metrics.jsonl",
            [{"step": 40, "tokens": 40 * BATCH, "eval/loss": 3.0, "lr": 1e-3, "annealed": 0.0}],
        )
    for exp in (tmp_path, sweep_dir):  # the sweep's evals log no LR: none counts as annealed
        pts = load(exp).fit_points()
        assert pts.empty and list(pts.columns) == FIT_COLUMNS
        with pytest.raises(AnalysisError, match="got 0"):
            chinchilla_from_points(pts)
        with pytest.raises(AnalysisError, match=">= 2 sizes"):
            fit_frontier(pts)


def starting_run(exp: Path, name: str) -> Path:
    """A run dir as Tune makes it when the trial starts, 10-30 s before the run's record."""
    run_dir = exp / "runs" / name
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("trainer: {}\n")
    return run_dir


def test_a_starting_run_is_left_out_with_a_warning(tmp_path: Path):
    """It failed the whole load with advice to remove the starting run's dir."""
    exp = make_ladder(tmp_path, sizes=SIZES)
    whole = load(exp)
    starting = starting_run(exp, "s3")
    with pytest.warns(RunWarning) as caught:
        res = load(exp)
    assert [str(w.message) for w in caught] == [
        f"{starting}: no run.json yet: starting, or never started; left out of the analysis"
    ]
    assert list(res.runs["name"]) == ["s1", "s2"]
    assert res.fit_points().equals(whole.fit_points())


def test_no_run_with_a_record_is_refused_in_one_line(tmp_path: Path):
    starting_run(tmp_path, "s1")
    starting_run(tmp_path, "s2")
    with pytest.raises(AnalysisError) as refused:
        load(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'runs'}: no run has a run.json yet (s1, s2: starting, or never started); "
        "load again once one has started, or, if the experiment is not running, rerun it with "
        "--resume"
    )


def test_a_starting_run_on_object_storage_is_named_by_its_url(tmp_path: Path):
    """Read through a staged copy: the warning names the run's URL, not the temporary dir."""
    exp = make_ladder(tmp_path / "exp", sizes=SIZES)
    starting_run(exp, "s3")
    url = "memory://bucket/live-ladder"
    fs = fsspec.filesystem("memory")
    fs.put(str(exp), url, recursive=True)
    try:
        with pytest.warns(RunWarning) as caught:
            res = load(url)
    finally:
        fs.rm(url, recursive=True)
    assert [str(w.message) for w in caught] == [
        f"{url}/runs/s3: no run.json yet: starting, or never started; left out of the analysis"
    ]
    assert list(res.runs["name"]) == ["s1", "s2"]
