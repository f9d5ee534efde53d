"""An LR sweep on Ray Tune with ASHA: early stops, a diverged trial, and a round of widening."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from trainer_core.analysis import load, lr_sweep_table, optimal_lr

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def run_records(sweep_dir: Path) -> dict[str, tuple[str, str]]:
    """Each run's run.json and metrics.jsonl, by run name: what a relaunch must leave as it is."""
    return {
        d.name: ((d / "run.json").read_text(), (d / "metrics.jsonl").read_text())
        for d in sorted((sweep_dir / "runs").iterdir())
    }


def test_sweep_stops_bad_lrs_flags_divergence_and_widens_past_an_edge(
    processes, tiny_experiment, tmp_path, no_local_ray
):
    """The grid tops out (healthily) at 1/8 of the formula's LR, far below the optimum and the
    LR meant to diverge: one widening round adds 1/2, a grid step (4x) into the gap. One-device sweep trials train in
    their trial's process (``ray.runner: auto``), so ASHA stops that process itself. The same
    command again, without ``--resume``, trains nothing: an early-stopped trial is as done as
    a finished one, so no run, LR optimum or widening round changes."""
    cfg = tiny_experiment(
        "sweep",
        sizes=["1M"],
        duration={"schedule": "cosine"},
        sweep={
            "factors": [0.0078125, 0.03125, 0.125, 1048576.0],
            "duration_multiple": 0.0009765625,
            "grace_fraction": 0.25,
            "widen_rounds": 1,
        },
        run={"trainer": {"log_interval": 1}, "train_module": {"max_grad_norm": None}},
    )
    out = processes.python("workflows/lr_sweep.py", "--config", cfg, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "x ideal" in out.stdout
    # "across cluster": Ray's log deduplication folding the trials' progress lines
    # "startup concurrency": Ray's warning that more processes started than the node has CPUs
    quiet = (
        "Reporting training result",
        "Progress bars disabled",
        "Traceback",
        "across cluster",
        "startup concurrency",
    )
    for chatter in quiet:
        assert chatter not in out.stdout + out.stderr, chatter

    assert "widening the grid, round 1" in out.stdout

    sweep_dir = tmp_path / "sweep-lr-sweep"  # beside the ladder dir the config names
    res = load(sweep_dir)
    table = lr_sweep_table(res).sort_values("lr")
    assert len(table) == 5
    diverged = table[table.diverged]
    assert list(diverged.lr) == [pytest.approx(table.lr.max())]
    assert int(diverged.diverged_step.iloc[0]) >= 1
    healthy = table[~table.diverged]
    stopped, full = healthy[healthy.stopped_early], healthy[~healthy.stopped_early]
    assert len(stopped) >= 1 and len(full) >= 1
    assert stopped.steps_run.max() < full.steps_run.min()
    # compared at the end the finished trials reached; the stopped ones count as worse
    assert (table.compared_step.dropna() == full.last_eval_step.min()).all()
    assert (stopped.compared_loss == math.inf).all()
    for run_dir in res.runs["dir"]:
        assert "runner: trial" in (Path(run_dir) / "config.yaml").read_text()
    # the first round's four trials, two at a time, ran in fewer processes: Tune reused them
    results = [json.loads(x) for f in (sweep_dir / "tune").glob("*/result.json") for x in f.open()]
    assert len({r["trial_id"] for r in results}) == 4 and len({r["pid"] for r in results}) < 4

    runs = json.loads((sweep_dir / "plan.json").read_text())
    assert runs[0]["size"] == "1M"
    formula = runs[0]["peak lr"]
    widened = res.runs[res.runs["tag_round"] == 1]
    assert list(widened["peak_lr"]) == [pytest.approx(formula / 2)]
    assert (sweep_dir / "tune-widen1").is_dir()
    best = optimal_lr(table)  # bounded above by the diverged LR only: its interval says so
    assert best.lr == pytest.approx(formula / 2) and not best.at_edge
    assert best.lr_high == pytest.approx(table.lr.max())

    before = run_records(sweep_dir)
    again = processes.python("workflows/lr_sweep.py", "--config", cfg, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[startup]" not in again.stdout + again.stderr  # no training loop started
    said = [line for line in again.stdout.splitlines() if "before at step" in line]
    named = {json.loads(record)["name"]: record for record, _ in before.values()}
    assert sorted(line.split("]", 1)[0][1:] for line in said) == sorted(named)
    assert all(re.fullmatch(r"\[\S+\] \w+ before at step \d+: not trained again", x) for x in said)
    assert "4 runs, each ended before this launch: nothing trained, Ray and Tune not started" in (
        again.stdout
    )
    assert "1 run, each ended before this launch" in again.stdout  # the widening round's
    assert run_records(sweep_dir) == before
    assert optimal_lr(lr_sweep_table(load(sweep_dir))).lr == pytest.approx(best.lr)
