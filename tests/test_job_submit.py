"""`ray start --head` + `ray job submit --working-dir` of a clean checkout, and the upload guard."""

from __future__ import annotations

import json
import signal
import sys
import tempfile
from pathlib import Path

import pytest

from trainer_core.ray.upload import UploadTooLargeError, check_upload

RAY = Path(sys.executable).parent / "ray"


def test_upload_guard_names_the_biggest_entries(tmp_path):
    (tmp_path / "code.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "big.bin", "wb") as f:
        f.truncate(120 * 2**20)  # sparse: no disk used
    (tmp_path / "runs").mkdir()
    with open(tmp_path / "runs" / "ckpt.bin", "wb") as f:
        f.truncate(500 * 2**20)
    (tmp_path / ".rayignore").write_text("runs\n")
    with pytest.raises(
        UploadTooLargeError, match=r"would upload 120 MiB.*biggest: data \(120 MiB\)"
    ):
        check_upload(tmp_path)
    (tmp_path / ".rayignore").write_text("runs\ndata\n")
    assert check_upload(tmp_path) < 2**20


def test_project_upload_fits(repo_root):
    assert check_upload(repo_root) < 10 * 2**20


def test_submit_script_runs_from_a_shell_and_asks_for_the_command(processes):
    out = processes.python("workflows/submit.py", "--no-wait")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("``python workflows/submit.py [--address URL] [--no-wait] -- ")


@pytest.mark.ray
@pytest.mark.slow
def test_job_submit_to_a_started_head(processes, free_port, repo_root, tmp_path, no_local_ray):
    checkout = tmp_path / "checkout"
    assert processes.run("git", "clone", "-q", repo_root, checkout).returncode == 0
    gcs, dashboard = free_port(), free_port()
    env = {"PATH": f"{RAY.parent}:{processes.env['PATH']}", "RAY_AUTH_MODE": "disabled"}
    head_log = tmp_path / "head.log"
    head = processes.start(
        RAY,
        "start",
        "--head",
        "--num-cpus=2",
        f"--port={gcs}",
        f"--dashboard-port={dashboard}",
        "--include-dashboard=true",
        "--block",
        f"--temp-dir={tempfile.mkdtemp(prefix='rl-')}",  # short: socket paths are capped
        log=head_log,
        env=env,
    )
    address = f"http://127.0.0.1:{dashboard}"
    # Ready once a job runs: `ray job list` answers before the head's job agent is up, and a
    # submit then fails with "No available agent to submit job".
    probe = (RAY, "job", "submit", "--address", address, "--", "python", "-c", "print(1)")
    processes.wait_until(
        lambda: processes.run(*probe, env=env, timeout=120).returncode == 0,
        head,
        head_log,
        timeout=180,
    )
    run_dir = tmp_path / "job-run"
    job = processes.run(
        RAY,
        "job",
        "submit",
        "--address",
        address,
        "--working-dir",
        checkout,
        "--",
        "python",
        "workflows/train.py",
        "--config",
        "workflows/configs/train-tiny.yaml",
        f"--trainer.run_dir={run_dir}",
        env=env,
        timeout=400,
    )
    assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-2000:]
    assert "succeeded" in job.stdout
    assert "finished: step 20" in job.stdout
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["last_step"] == 20
    processes.kill(head, signal.SIGTERM)
