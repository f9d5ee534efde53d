"""The report's own lines: each skipped fit named once, and analyze's --help with its defaults."""

from __future__ import annotations

import json
from io import StringIO

from rich.console import Console
from synthetic_experiments import make_ladder, write_run

from trainer_core.analysis import report_experiment


def test_a_skipped_fit_is_named_once(tmp_path):
    """Sizes too close for approach 2 and too few to hold one out: the errors name their fit
    themselves, and the report printed "skipped isoFLOP fit: isoFLOP: ..." and "skipped held-out
    check: held-out check: ..."."""
    root = make_ladder(tmp_path, sizes={"a": 2_000_000, "b": 3_000_000, "c": 4_000_000})
    text = StringIO()
    report = report_experiment(root, n_bootstrap=0, console=Console(file=text, soft_wrap=True))
    skipped = [line for line in text.getvalue().splitlines() if line.startswith("skipped ")]
    assert skipped == [f"skipped {reason}" for reason in report.skipped]
    assert any(s.startswith("skipped isoFLOP fit: 4 budgets covered by 3 sizes") for s in skipped)
    assert any(s.startswith("skipped held-out check: no law fits the smaller") for s in skipped)


def test_analyze_help_shows_the_bootstrap_default(run_script):
    code, out, _ = run_script("workflows/analyze.py", "--help")
    assert code == 0
    assert "bootstrap resamples for the CIs (default: 200; 0: no intervals)" in " ".join(
        out.split()
    )


def test_a_ladder_whose_runs_all_ended_without_a_point_is_not_told_to_wait(tmp_path):
    """Every run diverged before its first annealed eval: the fits are skipped for that reason,
    not "yet"; a ladder still running is."""
    for size, status in (("a", "diverged"), ("b", "failed")):
        write_run(
            tmp_path / "runs" / size,
            size=size,
            n=2_000_000,
            lr=1.0,
            total_steps=100,
            status=status,
            last_step=5,
            diverged_step=5,
            tags={"ladder": "syn"},
        )
    report = report_experiment(tmp_path, n_bootstrap=0, console=Console(file=StringIO()))
    assert report.skipped == [
        "scaling-law fits: no annealed eval points: every run ended without one (1 diverged, 1 failed)"
    ]
    record = json.loads((tmp_path / "runs" / "b" / "run.json").read_text())
    record["status"] = "running"
    (tmp_path / "runs" / "b" / "run.json").write_text(json.dumps(record))
    report = report_experiment(tmp_path, n_bootstrap=0, console=Console(file=StringIO()))
    assert report.skipped == [
        "scaling-law fits: no annealed eval points yet (1 diverged, 1 running)"
    ]


def test_the_final_table_says_how_often_a_run_started(tmp_path):
    """A run restarted after a lost node finished as if in one go: its restart was in
    run.json's workers alone."""
    for size, starts in (("a", 1), ("b", 3)):
        write_run(tmp_path / "runs" / size, size=size, n=2_000_000, lr=1e-3, total_steps=100)
        path = tmp_path / "runs" / size / "run.json"
        record = json.loads(path.read_text())
        record["workers"] = [
            {"start_step": 40 * i, "time": 0.0, "ranks": []} for i in range(starts)
        ]
        path.write_text(json.dumps(record))
    console = Console(file=StringIO(), width=200)
    report_experiment(tmp_path, n_bootstrap=0, console=console)
    rows = {line.split()[1]: line for line in console.file.getvalue().splitlines() if "│" in line}
    assert "finished, 3 starts" in rows["b"] and "starts" not in rows["a"]
