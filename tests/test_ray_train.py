"""Runs through Ray Train: equality with the plain loop, worker-failure recovery, W&B offline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from trainer_core.configio import load_config
from trainer_core.ray.config import RayTrainConfig
from trainer_core.ray.train_run import run_training

pytestmark = pytest.mark.ray

TINY = [
    "--model.n_layers=2",
    "--data.seq_len=64",
    "--trainer.global_batch_size=512",
    "--trainer.max_steps=16",
    "--trainer.log_interval=2",
    "--trainer.eval_interval=8",
    "--trainer.eval_batches=2",
    "--checkpoint.save_interval_minutes=null",
    "--checkpoint.save_interval_steps=4",
    "--ray.num_workers=2",
    "--ray.cpus_per_worker=0.5",
]


def config(run_dir: Path, *extra: str) -> RayTrainConfig:
    return load_config(RayTrainConfig, None, [*TINY, f"--trainer.run_dir={run_dir}", *extra])


def losses(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss_last"] for r in lines if "train/loss_last" in r}


@pytest.fixture(scope="module")
def reference_run(ray_session, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ray") / "reference"
    summary = run_training(config(run_dir, "--tracking.wandb=true"))
    return run_dir, summary


def test_two_worker_run_matches_plain_loop(reference_run, tmp_path):
    from trainer_core.config import TrainConfig
    from trainer_core.configio import from_dict, to_dict
    from trainer_core.run import build_trainer

    run_dir, summary = reference_run
    assert summary["status"] == "finished" and summary["last_step"] == 16
    data = to_dict(config(tmp_path / "plain"))
    data.pop("ray")
    build_trainer(from_dict(TrainConfig, data)).fit()
    ray_losses, plain = losses(run_dir), losses(tmp_path / "plain")
    assert sorted(ray_losses) == list(range(2, 17, 2))
    for step, value in plain.items():
        assert ray_losses[step] == pytest.approx(value, abs=1e-4), step


def test_wandb_offline_files_and_no_secrets(reference_run):
    run_dir, _ = reference_run
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert list(offline[0].glob("*.wandb"))
    dumped = (run_dir / "config.yaml").read_text() + (run_dir / "run.json").read_text()
    assert "api_key" not in dumped.lower()


def test_finished_run_is_not_rerun(reference_run):
    run_dir, summary = reference_run
    before = (run_dir / "metrics.jsonl").stat().st_mtime
    again = run_training(config(run_dir))
    assert again["last_step"] == 16 and (run_dir / "metrics.jsonl").stat().st_mtime == before


def _kill_a_worker_when(run_dir: Path, step: int, killed: list[int]) -> None:
    deadline = time.time() + 240
    metrics = run_dir / "metrics.jsonl"
    while time.time() < deadline:
        if metrics.exists() and any(
            json.loads(x).get("step", 0) >= step for x in metrics.read_text().splitlines() if x
        ):
            for proc in psutil.process_iter(["pid", "cmdline"]):
                cmd = " ".join(proc.info["cmdline"] or [])
                if "RayTrainWorker" in cmd and proc.info["pid"] != os.getpid():
                    os.kill(proc.info["pid"], signal.SIGKILL)
                    killed.append(proc.info["pid"])
                    return
        time.sleep(0.05)


def test_worker_sigkill_resumes_to_the_same_loss(reference_run, tmp_path):
    ref_dir, ref_summary = reference_run
    run_dir = tmp_path / "killed"
    killed: list[int] = []
    watcher = threading.Thread(target=_kill_a_worker_when, args=(run_dir, 9, killed))
    watcher.start()
    summary = run_training(config(run_dir, "--ray.max_failures=2"))
    watcher.join()
    assert killed, "no Ray Train worker process was found to kill"
    assert summary["status"] == "finished" and summary["last_step"] == 16
    assert summary["train/loss_last"] == pytest.approx(ref_summary["train/loss_last"], abs=1e-5)
    assert summary["eval/loss"] == pytest.approx(ref_summary["eval/loss"], abs=1e-5)


def test_every_ray_worker_process_starts_with_ray_chatter_turned_down(no_local_ray):
    """init_ray's setup hook runs in each worker process, Train's controller included, so the
    traceback Ray Train logs when early stopping kills a trial never reaches the user, even after
    Ray Train configures its loggers (as it does, with dictConfig, when a controller starts)."""
    code = (
        "import logging, logging.config, ray\n"
        "from trainer_core.ray.runtime import init_ray\n"
        "init_ray('local')\n"
        "@ray.remote(num_cpus=0)\n"
        "def passes(name, level):\n"
        "    config = {'version': 1, 'disable_existing_loggers': False,\n"
        "              'loggers': {'ray.train': {'level': 'DEBUG'}}}\n"
        "    logging.config.dictConfig(config)\n"
        "    record = logging.LogRecord(name, level, 'x.py', 0, 'msg', None, None)\n"
        "    return logging.getLogger(name).filter(record)\n"
        "name = 'ray.train.v2._internal.callbacks.backend_setup'\n"
        "print(ray.get([passes.remote(name, logging.WARNING), passes.remote(name, logging.ERROR)]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[False, True]"
