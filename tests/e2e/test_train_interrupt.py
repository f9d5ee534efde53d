"""Ctrl+C or SIGTERM on ``workflows/train.py``: a run on Ray Train ends as one without Ray does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_core.io.run_dir import last_logged_step

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LONG_TINY_RUN = (
    "--model.n_layers=2",
    "--data.seq_len=64",
    "--trainer.global_batch_size=512",
    "--trainer.max_steps=10000",
    "--trainer.log_interval=1",
    "--trainer.eval_interval=1000",
    "--trainer.eval_batches=2",
    "--trainer.progress=false",
    "--checkpoint.save_interval_steps=5",
    "--checkpoint.save_interval_minutes=null",
    "--ray.num_workers=1",
    "--ray.address=local",
)
"""The tests' tiny run (conftest's ``TINY_RUN``) on one Ray Train worker, long enough to be
interrupted mid-run: it logs every step and checkpoints every 5."""

SAID = re.compile(
    r"interrupted at step (\d+); the latest checkpoint is step (\d+): re-run the same command "
    r"to resume"
)


def _ended_as_interrupted(proc: subprocess.Popen, log: Path, run_dir: Path) -> int:
    """Check the run ended in the one line, exit 130, run.json ``interrupted`` at the step the
    line names, its last logged one; return the checkpoint the line says re-running resumes."""
    out = log.read_text()
    assert proc.returncode == 130 and "Traceback" not in out, out[-3000:]
    # Ray's own processes, signalled with the group, may print after it (abseil's mutex lines),
    # and a worker's last line, forwarded by Ray's log thread, may land just before it unended.
    said = [m for line in out.splitlines() if (m := SAID.search(line)) and m.end() == len(line)]
    assert len(said) == 1, out[-3000:]
    match = said[0]
    step, checkpoint = int(match[1]), int(match[2])
    assert 0 < checkpoint <= step == last_logged_step(run_dir)
    assert (run_dir / "checkpoints" / f"step-{checkpoint:08d}" / "info.json").is_file()
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["status"], run["last_step"]) == ("interrupted", step), run
    return checkpoint


def test_ctrl_c_then_sigterm_end_a_ray_train_run_in_one_line_and_it_resumes(
    processes, tmp_path, no_local_ray
):
    """Ray Train's own SIGINT handler aborted the run, killing the workers before rank 0 could
    record it: the driver exited 1 without a word and run.json stayed "running" at last_step 0.
    Now a Ctrl+C (to the terminal's process group) and a SIGTERM (``ray job stop``: the driver
    alone) each end it as without Ray, and the same command resumes from the checkpoint named."""
    run_dir = tmp_path / "run"
    args = (f"--trainer.run_dir={run_dir}", *LONG_TINY_RUN)

    def groups() -> list[dict]:
        record = run_dir / "run.json"
        return json.loads(record.read_text())["workers"] if record.is_file() else []

    log = tmp_path / "first.log"
    proc = processes.start(sys.executable, "workflows/train.py", *args, log=log)
    processes.wait_until(lambda: last_logged_step(run_dir) >= 7, proc, log, 240)
    processes.kill(proc, signal.SIGINT, timeout=120)
    checkpoint = _ended_as_interrupted(proc, log, run_dir)

    log = tmp_path / "again.log"
    proc = processes.start(sys.executable, "workflows/train.py", *args, log=log)
    processes.wait_until(
        lambda: len(groups()) == 2 and last_logged_step(run_dir) > checkpoint, proc, log, 240
    )
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    assert _ended_as_interrupted(proc, log, run_dir) >= checkpoint
    assert groups()[1]["start_step"] == checkpoint, "the same command resumed where it stopped"
