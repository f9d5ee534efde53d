"""The ladder workflow end to end: dry run, bad input, a Tune ladder whose driver is killed and resumed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainer_core.analysis import load

ROOT = Path(__file__).resolve().parents[1]
LADDER = ROOT / "workflows" / "ladder.py"


def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "ladder.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            name: tiny
            dir: {tmp_path / "exp"}
            sizes: [1M, 3M]
            seq_len: 64
            batch: {{coef: 20480.0}}
            duration: {{chinchilla_multiple: 0.0009765625}}
            run:
              trainer: {{log_interval: 5, eval_interval: 1000000, eval_batches: 2}}
              checkpoint: {{save_interval_minutes: null, save_interval_steps: 5}}
            ray: {{cpus_per_worker: 0.8, address: local}}
            """
        )
    )
    return path


def run_cli(*args: str, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, str(LADDER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )


def test_dry_run_prints_the_plan_and_plots_the_schedule(tmp_path):
    out = run_cli("--config", str(tiny_config(tmp_path)), "--dry-run")
    assert out.returncode == 0, out.stderr
    for column in ("batch tokens", "micro seqs", "accum", "peak lr", "ckpt steps", "device-h"):
        assert column in out.stdout
    assert "1M" in out.stdout and "3M" in out.stdout
    png = tmp_path / "exp" / "lr_schedule.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sizes", "1M,30M"], "sizes: '30M' is not in the size table"),
        (["--vocab_size=200"], "model.vocab_size"),
        (["--dir=/proc/rayladder-cannot-write"], "is not writable"),
    ],
)
def test_bad_input_fails_before_any_trial(tmp_path, args, message):
    out = run_cli("--config", str(tiny_config(tmp_path)), *args, timeout=120)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "exp" / "tune").exists()


def test_a_dir_holding_an_lr_sweep_is_refused(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "experiment.yaml").write_text("name: s\nsweep: {search: grid}\n")
    out = run_cli("--config", str(tiny_config(tmp_path)), timeout=120)
    assert out.returncode == 2, out.stderr
    assert "already holds a different experiment (LR sweep" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "exp" / "tune").exists()


@pytest.mark.ray
def test_benchmark_prints_throughput_and_mfu(tmp_path, no_local_ray):
    out = run_cli("--config", str(tiny_config(tmp_path)), "--benchmark", "1M", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    match = re.search(
        r"benchmark 1M: ([\d,]+) tokens/s per device, MFU ([\d.]+)% on 1 device", out.stdout
    )
    assert match, out.stdout[-2000:]
    assert int(match.group(1).replace(",", "")) > 0 and 0 < float(match.group(2)) < 100
    (run_dir,) = (tmp_path / "exp" / "benchmarks").iterdir()
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 20 and not (run_dir / "checkpoints").exists()


def wait_for(predicate, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if process.poll() is not None:
            raise AssertionError(f"ladder exited early:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"condition not reached:\n{log.read_text()[-3000:]}")


def run_status(exp: Path, size: str) -> str:
    path = exp / "runs" / size / "run.json"
    return json.loads(path.read_text())["status"] if path.exists() else "absent"


@pytest.mark.ray
def test_killed_driver_resumes_and_fits(tmp_path, no_local_ray):
    cfg = tiny_config(tmp_path)
    exp = tmp_path / "exp"
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "first.log"
    first = subprocess.Popen(
        [sys.executable, str(LADDER), "--config", str(cfg)],
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        # Kill once one size has finished and the other has a checkpoint but is still running.
        ckpts = exp / "runs" / "3M" / "checkpoints"
        wait_for(
            lambda: (
                {run_status(exp, "1M"), run_status(exp, "3M")} == {"finished", "running"}
                and (
                    any(ckpts.glob("step-*"))
                    or any((exp / "runs" / "1M" / "checkpoints").glob("step-*"))
                )
            ),
            first,
            log_path,
            timeout=300,
        )
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    finished = [s for s in ("1M", "3M") if run_status(exp, s) == "finished"]
    assert len(finished) == 1
    done_metrics = (exp / "runs" / finished[0] / "metrics.jsonl").read_text()

    second = run_cli("--config", str(cfg), "--resume", timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    # the finished size was not trained again; the other resumed from its checkpoint
    assert (exp / "runs" / finished[0] / "metrics.jsonl").read_text() == done_metrics
    assert "resumed at step" in second.stdout
    assert {run_status(exp, s) for s in ("1M", "3M")} == {"finished"}

    results = load(exp)
    grid = results.result_grid()  # Tune's view, restored across the driver kill
    assert sorted(r.metrics["finished"] for r in grid) == [1, 1]
    assert grid.get_best_result().metrics["eval/loss"] == pytest.approx(
        results.final()["final_eval_loss"].min()
    )
    final = results.final().set_index("size")
    assert final.loc["3M", "final_eval_loss"] < final.loc["1M", "final_eval_loss"]
    assert (exp / "lr_schedule.png").exists()
    assert "L(C)" in second.stdout or "loss vs compute" in second.stdout
