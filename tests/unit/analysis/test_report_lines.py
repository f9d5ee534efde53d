"""The report's own lines: each skipped fit named once, and analyze's --help with its defaults."""

from __future__ import annotations

from io import StringIO

from rich.console import Console
from synthetic_experiments import make_ladder

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
