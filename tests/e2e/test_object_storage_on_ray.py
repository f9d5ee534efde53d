"""A ladder and Ray Data's reader on object storage, against a real S3 server on 127.0.0.1
(the runs and shards on S3 without Ray: test_object_storage.py)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from ray_train_hooks import HOLD_ENV, KILL_ENV, read_log
from reference import fit_on_one_thread
from restarts import restart_lines
from s3_server import SECRET, s3_objects, s3_server  # noqa: F401  (s3_server: the fixture)
from test_ladder_run import LADDER
from waiting import alive, wait_for

from trainer_core.analysis import load
from trainer_core.config.loader import load_config
from trainer_core.config.sections import DataConfig
from trainer_core.data.token_data import open_token_data
from trainer_core.io import storage
from trainer_core.io.storage import STAGE_ENV
from trainer_core.ladder.plan import plan_ladder
from trainer_core.ray.ladder_run import LadderJobConfig
from trainer_core.ray.reader import batches_from_shard, ray_train_dataset
from trainer_core.ray.runtime import init_ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def s3_ray(s3_server, _ray_owner):  # noqa: F811
    """A local Ray started after the S3 env is set, so its workers inherit it (as a user's
    driver env reaches a local Ray); shut down after, so later modules get a Ray without it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    init_ray("local", num_cpus=2, dashboard=False)
    yield ray
    ray.shutdown()


def test_ray_reader_streams_shards_from_s3(s3_ray, s3_server, make_shards, random_texts):  # noqa: F811
    local_dir = make_shards(random_texts(40))
    url = s3_server.upload(local_dir, "shards/ray")
    remote = open_token_data(DataConfig(shards=url), 320)
    local = open_token_data(DataConfig(shards=str(local_dir)), 320)
    ds = ray_train_dataset(remote.spec, 16, 4, 5, 1, 3, 1, 2)
    got = list(batches_from_shard(ds, 2, expected_start_step=1))
    want = list(itertools.islice(local.train_batches(16, 4, 5, 1, 1, 2), 3))
    assert len(got) == 3 and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.fixture
def ray_tmp():
    """A temp dir for the Ray a ladder driver starts (its session logs land there): short,
    since Ray's socket paths are capped near 100 characters."""
    path = Path(tempfile.mkdtemp(prefix="rl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def s3_run_json(url: str, size: str) -> dict:
    path = f"{url}/runs/{size}/run.json"
    return json.loads(storage.read_text(path)) if storage.is_file(path) else {}


@pytest.mark.ray
def test_a_ladder_on_s3_survives_a_killed_worker_and_a_killed_driver(
    s3_server,  # noqa: F811
    processes,
    tiny_experiment,
    repo_root,
    tmp_path,
    no_local_ray,
    ray_tmp,
):
    """The whole experiment lives on S3. 300K's worker is SIGKILLed at its step-5 report (Ray
    Train restarts it from the checkpoint on S3); the driver is SIGKILLed once 300K has finished
    while 1M is held at step 5; ``--resume`` finishes 1M from S3. 300K ends where a plain local
    run of its plan does, Tune's state and the plots are on S3, and no credential is anywhere."""
    url = f"s3://{s3_server.bucket}/ladders/exp"
    config = tiny_experiment(
        "exp",
        dir=url,
        sizes=["300K", "1M"],
        # half the tiny ladder's batch and tokens: 18 and 20 steps
        batch={"coef": 10240.0},
        duration={"chinchilla_multiple": 0.00048828125},
        run={
            "trainer": {"log_interval": 5, "eval_interval": 1000000},
            "checkpoint": {"save_interval_steps": 5},
        },
    )
    hold_log, kill_log = tmp_path / "hold.jsonl", tmp_path / "kill.jsonl"
    hooks = {
        "RAY_TRAIN_CALLBACKS": "ray_train_hooks.HoldRun,ray_train_hooks.KillWorkerFromEnv",
        HOLD_ENV: f"1M:5:{hold_log}",
        KILL_ENV: f"300K:5:0:{kill_log}",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(repo_root / "tests" / "support"), os.environ.get("PYTHONPATH")) if p
        ),
        STAGE_ENV: str(tmp_path / "stage"),
        "RAY_TMPDIR": str(ray_tmp),
    }
    log = tmp_path / "first.log"
    first = processes.start(sys.executable, LADDER, "--config", config, log=log, env=hooks)

    def held_and_one_done() -> bool:
        held = hold_log.exists() and '"held"' in hold_log.read_text()
        return held and s3_run_json(url, "300K").get("status") == "finished"

    processes.wait_until(held_and_one_done, first, log, timeout=400)
    processes.kill(first)
    workers = read_log(hold_log)[0]["workers"]
    wait_for(lambda: not any(map(alive, workers)), timeout=60)
    assert s3_run_json(url, "1M")["status"] == "running"
    first_group, kill, second_group = read_log(kill_log)
    assert kill == {"killed": first_group["workers"][0], "step": 5}
    assert len(second_group["workers"]) == 1
    one = s3_run_json(url, "300K")
    assert [g["start_step"] for g in one["workers"]] == [0, 5]
    (said,) = restart_lines(log.read_text())
    assert said["run"] == "exp-300K" and said["causes"].startswith("rank 0: "), said
    assert said["count"] == "restart 1, ray.max_failures 3"

    env = {STAGE_ENV: str(tmp_path / "stage"), "RAY_TMPDIR": str(ray_tmp)}
    second = processes.python(LADDER, "--config", config, "--resume", timeout=600, env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "[exp-1M] training exp-1M" in second.stdout and "resumed at step" in second.stdout
    ended = [line for line in second.stdout.splitlines() if line.startswith("[exp-300K]")]
    assert len(ended) == 1 and re.fullmatch(  # and not trained again
        r"\[exp-300K\] finished before at step \d+: not trained again", ended[0]
    ), second.stdout[-3000:]
    assert "Found credentials" not in second.stderr  # the S3 client's chatter stays quiet

    results = load(url)
    final = results.final().set_index("size")
    assert set(final["status"]) == {"finished"}
    job = load_config(LadderJobConfig, config, [])
    for plan in plan_ladder(job, ["300K", "1M"]):  # each as one plain local run, on one thread
        ref_dir = str(tmp_path / "ref" / plan.size)
        trainer = replace(plan.config.trainer, run_dir=ref_dir)
        checkpoint = replace(plan.config.checkpoint, enabled=False)
        reference = fit_on_one_thread(replace(plan.config, trainer=trainer, checkpoint=checkpoint))
        measured = final.loc[plan.size, "final_eval_loss"]
        assert measured == pytest.approx(reference["eval/loss"], abs=1e-5), plan.size
    grid = results.result_grid()  # Tune's state, on S3, restored across the driver kill
    assert sorted(r.metrics["finished"] for r in grid) == [1, 1]

    objects = s3_objects(url)
    assert "lr_schedule.png" in objects and "analysis/loss_curves.png" in objects
    assert any(key.startswith("tune/") for key in objects)
    assert [k for k, v in objects.items() if SECRET.encode() in v] == []
    for text in (log.read_text(), second.stdout, second.stderr):
        assert SECRET not in text
    # nor in anything written on this machine: the upload stage, the Ray session's logs
    local_files = [p for p in [*tmp_path.rglob("*"), *ray_tmp.rglob("*")] if p.is_file()]
    assert [p for p in local_files if SECRET.encode() in p.read_bytes()] == []
