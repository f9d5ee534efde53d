"""Ctrl+C on a ladder's driver: an interrupted experiment, said so, not a finished one."""

from __future__ import annotations

import json
import signal
import sys

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_ctrl_c_stops_the_ladder_as_interrupted_not_done(
    processes, tiny_experiment, tmp_path, no_local_ray
):
    """Tune returns from a Ctrl+C as from a finished experiment: the ladder printed its
    analysis of the runs so far, exited 0 and recorded the interrupted run as stopped by early
    stopping; an LR sweep went on to widen its grid from partial results."""
    cfg = tiny_experiment(
        "exp",
        sizes=["1M"],
        duration={"chinchilla_multiple": 0.25},  # thousands of steps: still running at the ^C
        run={"trainer": {"log_interval": 1, "eval_interval": 1000000}},
    )
    log = tmp_path / "ladder.log"
    proc = processes.start(sys.executable, "workflows/ladder.py", "--config", cfg, log=log)
    metrics = tmp_path / "exp" / "runs" / "1M" / "metrics.jsonl"
    processes.wait_until(lambda: metrics.is_file() and metrics.stat().st_size, proc, log, 300)
    processes.kill(proc, signal.SIGINT, timeout=180)  # to the group, as a terminal's Ctrl+C
    out = log.read_text()
    assert proc.returncode == 2, out[-3000:]
    assert "interrupted with 1 of 1 runs unfinished" in out and "with --resume" in out
    assert "Traceback" not in out
    run = json.loads((metrics.parent / "run.json").read_text())
    # Unfinished and resumable: neither stopped (early stopping's word) nor finished nor failed.
    assert run["status"] == "running" and run["last_step"] < run["total_steps"], run
