"""`ray start --head` + `ray job submit --working-dir` of a clean checkout, and the upload guard."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from trainer_core.ray.upload import UploadTooLargeError, check_upload

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def test_project_upload_fits():
    assert check_upload(ROOT) < 10 * 2**20


@pytest.mark.ray
def test_job_submit_to_a_started_head(tmp_path, no_local_ray):
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(checkout)], check=True)
    gcs, dashboard = free_port(), free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "RAY_AUTH_MODE": "disabled",
        "RAY_ADDRESS": "",
    }
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--num-cpus=2",
            f"--port={gcs}",
            f"--dashboard-port={dashboard}",
            "--include-dashboard=true",
            "--block",
            f"--temp-dir={tempfile.mkdtemp(prefix='rl-')}",  # short: socket paths are capped
        ],
        env=env,
        stdout=(tmp_path / "head.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        address = f"http://127.0.0.1:{dashboard}"
        deadline = time.time() + 90
        while True:
            probe = subprocess.run(
                [str(BIN / "ray"), "job", "list", "--address", address],
                env=env,
                capture_output=True,
                text=True,
            )
            if probe.returncode == 0:
                break
            assert head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
            assert time.time() < deadline, (tmp_path / "head.log").read_text()[-3000:]
            time.sleep(1)
        run_dir = tmp_path / "job-run"
        job = subprocess.run(
            [
                str(BIN / "ray"),
                "job",
                "submit",
                "--address",
                address,
                "--working-dir",
                str(checkout),
                "--",
                "python",
                "workflows/train.py",
                "--config",
                "workflows/configs/train-tiny.yaml",
                f"--trainer.run_dir={run_dir}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-2000:]
        assert "succeeded" in job.stdout
        assert "finished: step 20" in job.stdout
        info = json.loads((run_dir / "run.json").read_text())
        assert info["status"] == "finished" and info["last_step"] == 20
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
