"""Ctrl+C on a ladder's driver: an interrupted experiment, said so, not a finished one."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest

from trainer_core.io.run_dir import last_logged_step

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def interrupted_ladder(processes, tiny_experiment, tmp_path, stop) -> tuple[Path, str]:
    """A two-size ladder (25K first, then 15K) on its own Ray, ``stop``ped once 25K has saved a
    checkpoint, while 15K waits its turn: its config and the ladder's output."""
    cfg = tiny_experiment(
        "exp",
        sizes=["15K", "25K"],
        # 25K first (largest first), 725 steps: still running at the stop (near step 110 of a
        # 60-step/s run here), yet few to train on when resumed
        duration={"chinchilla_multiple": 0.015625, "multiple_by_size": {"25K": 0.125}},
        run={
            "trainer": {"log_interval": 1, "eval_interval": 1000000},
            "checkpoint": {"save_interval_steps": 50},
        },
        ray={"max_concurrent_trials": 1},
    )
    log = tmp_path / "ladder.log"
    proc = processes.start(sys.executable, "workflows/ladder.py", "--config", cfg, log=log)
    checkpoints = tmp_path / "exp" / "runs" / "25K" / "checkpoints"
    saved = re.compile(r"step-\d{8}")
    processes.wait_until(
        lambda: (
            checkpoints.is_dir() and any(saved.fullmatch(p.name) for p in checkpoints.iterdir())
        ),
        proc,
        log,
        300,
    )
    stop(proc)
    out = log.read_text()
    assert proc.returncode == 2, out[-3000:]
    assert "interrupted with 2 of 2 runs unfinished" in out and "with --resume" in out
    assert "Traceback" not in out
    return cfg, out


def test_ctrl_c_stops_the_ladder_as_interrupted_and_a_moved_copy_resumes_every_run(
    processes, tiny_experiment, tmp_path, no_local_ray
):
    """Tune returns from a Ctrl+C as from a finished experiment: the ladder printed its
    analysis of the runs so far, exited 0 and recorded the interrupted run as stopped by early
    stopping (later it left it "running" at step 0, though the run had trained on); an LR sweep
    went on to widen its grid from partial results. The resume, of a copy elsewhere with
    ``--resume`` there (refused before: "dir differ"): a run the interrupt left unstarted got
    Tune's placeholder for its config ('tuple' object has no attribute 'ray'), was retried to
    failure, and the count said 1 of 1 unfinished; the cut-off run goes on from the copied
    checkpoint, and the original stays as it was."""
    cfg, _ = interrupted_ladder(
        processes,
        tiny_experiment,
        tmp_path,
        lambda proc: processes.kill(proc, signal.SIGINT),  # to the group, as a terminal's
    )
    runs = tmp_path / "exp" / "runs"
    run = json.loads((runs / "25K" / "run.json").read_text())
    # Unfinished and resumable: neither stopped (early stopping's word) nor finished nor failed,
    # nor "running" at step 0 as its start wrote it: interrupted where its metrics end (a Ray
    # Train worker of the stopped trial, killed a moment later, may log one step more).
    assert run["status"] == "interrupted", run
    logged = last_logged_step(runs / "25K")
    assert 0 < logged - 2 <= run["last_step"] <= logged < run["total_steps"], run
    assert not (runs / "15K" / "run.json").exists()

    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "exp", moved, symlinks=True)
    resumed = processes.python(
        "workflows/ladder.py", "--config", cfg, f"--dir={moved}", "--resume", timeout=600
    )
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "has no attribute" not in out
    assert "startup concurrency" not in out  # Ray's warning of more processes than CPUs
    assert re.search(r"resumed at step [1-9]", out), out[-3000:]
    for size in ("15K", "25K"):
        run = json.loads((moved / "runs" / size / "run.json").read_text())
        assert run["status"] == "finished" and run["last_step"] == run["total_steps"], run
    left = json.loads((runs / "25K" / "run.json").read_text())
    assert left["status"] == "interrupted" and left["last_step"] < left["total_steps"], left
    assert not (runs / "15K" / "run.json").exists()


def test_sigterm_stops_the_ladder_as_ctrl_c_does(
    processes, tiny_experiment, tmp_path, no_local_ray
):
    """``ray job stop`` sends SIGTERM to the driver, whose handler ``ray.init`` had set: it died
    mid-write with a C++ stack from Ray's signal handler and no word of ``--resume``. Now it
    ends as a Ctrl+C does (whose resume the test above runs)."""

    def sigterm(proc):
        os.kill(proc.pid, signal.SIGTERM)  # the driver alone, as `ray job stop` signals a job
        proc.wait(timeout=180)

    _, out = interrupted_ladder(processes, tiny_experiment, tmp_path, sigterm)
    assert "SIGTERM received" not in out
    run = json.loads((tmp_path / "exp" / "runs" / "25K" / "run.json").read_text())
    assert run["status"] == "interrupted" and run["last_step"] < run["total_steps"], run
    assert not (tmp_path / "exp" / "runs" / "15K" / "run.json").exists()
