"""Token shards, runs and experiments on object storage, against a real S3 server on 127.0.0.1
(the ladder and the Ray Data reader on S3: test_object_storage_on_ray.py)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest
import s3fs
import torch
from s3_server import SECRET, s3_objects, s3_server  # noqa: F401  (s3_server: the fixture)
from synthetic_experiments import LADDER_N, make_ladder, write_checkpoint
from test_ladder_run import LADDER

from trainer_core.analysis import load
from trainer_core.analysis.errors import AnalysisError
from trainer_core.checkpoint.checkpointer import Checkpointer
from trainer_core.checkpoint.listing import list_checkpoints
from trainer_core.config.sections import CheckpointConfig, DataConfig
from trainer_core.data.shards import DataError, ShardError
from trainer_core.data.token_data import open_token_data
from trainer_core.io import storage
from trainer_core.train.build import build_trainer

pytestmark = pytest.mark.slow


def test_shards_on_s3_read_like_local_ones_with_the_same_checks(
    s3_server,  # noqa: F811
    make_shards,
    random_texts,
):
    local_dir = make_shards(random_texts(40))
    url = s3_server.upload(local_dir, "shards/web")
    local = open_token_data(DataConfig(shards=str(local_dir)), 320)
    remote = open_token_data(DataConfig(shards=url), 320)
    assert remote.manifest.path == f"{url}/manifest.json"
    got = list(itertools.islice(remote.train_batches(16, 4, 3, 2, 0, 1), 3))
    want = list(itertools.islice(local.train_batches(16, 4, 3, 2, 0, 1), 3))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert all(
        torch.equal(g, w)
        for g, w in zip(remote.eval_batches(16, 4, 2), local.eval_batches(16, 4, 2), strict=True)
    )

    fs = s3fs.S3FileSystem()
    flipped = f"{url}/part-00002.parquet"
    chunk = pq.ParquetFile(local_dir / "part-00002.parquet").metadata.row_group(0).column(0)
    raw = bytearray(fs.cat(flipped))
    raw[chunk.data_page_offset + chunk.total_compressed_size - 1] ^= 0x10
    fs.pipe(flipped, bytes(raw))
    corrupt = open_token_data(DataConfig(shards=url), 320)
    epoch_steps = corrupt.train[0].num_windows(16) // 4 + 1
    with pytest.raises(ShardError, match=f"^{flipped}: row group 0 is corrupt"):
        list(itertools.islice(corrupt.train_batches(16, 4, 0), epoch_steps))

    part = f"{url}/part-00001.parquet"
    fs.pipe(part, fs.cat(part)[:-10])
    with pytest.raises(DataError, match=f"^{part}: shard is .* the manifest says .*truncated"):
        open_token_data(DataConfig(shards=url), 320)
    fs.rm(part)
    with pytest.raises(
        DataError, match=f"^{part}: shard file listed in {url}/manifest.json is missing"
    ):
        open_token_data(DataConfig(shards=url), 320)
    with pytest.raises(DataError, match=f"^{url}-nothing/manifest.json: no shard manifest there"):
        open_token_data(DataConfig(shards=f"{url}-nothing"), 320)


def test_analysis_reads_an_experiment_from_s3(s3_server, tmp_path, run_script, processes):  # noqa: F811
    exp = make_ladder(tmp_path / "exp")
    run_dir = exp / "runs" / "s1"
    ckpt = write_checkpoint(run_dir, 999, [0], 1)
    (ckpt / "__0_0.distcp").write_bytes(b"x" * 5000)
    (ckpt / ".done-rank0-of-1").write_text(json.dumps({"files": {"__0_0.distcp": {"size": 5000}}}))
    url = s3_server.upload(exp, "experiments/ladder")

    local, remote = load(exp), load(url)
    assert remote.path == url
    assert list(remote.runs["dir"]) == [f"{url}/runs/{n}" for n in remote.runs["name"]]
    pd.testing.assert_frame_equal(remote.metrics, local.metrics)
    pd.testing.assert_frame_equal(remote.points, local.points)
    row = remote.checkpoints.set_index(["name", "step"]).loc[("s1", 999)]
    assert row["complete"] and row["path"] == f"{url}/runs/s1/checkpoints/step-00000999"

    # As a user runs it, on the experiment: the fits from S3, the PNGs written back there.
    out = processes.python("workflows/analyze.py", url, "--bootstrap", "5", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "L(N, D)" in out.stdout and "held out" in out.stdout, out.stdout[-3000:]
    plots = s3fs.S3FileSystem().ls(f"{url}/analysis")
    assert {p.rsplit("/", 1)[1] for p in plots} >= {"loss_curves.png", "loss_vs_compute.png"}

    s3fs.S3FileSystem().rm(f"{url}/runs/s2/run.json")  # as while its run starts
    with pytest.warns(UserWarning, match=f"^{url}/runs/s2: no run.json yet: starting"):
        assert list(load(url).runs["name"]) == [s for s in LADDER_N if s != "s2"]
    with pytest.raises(AnalysisError, match=f"^{url}-gone: no such directory"):
        load(f"{url}-gone")

    # One run dir keeps the fits (and this test) cheap; the CLI path is the same.
    code, out, err = run_script("workflows/analyze.py", f"{url}/runs/s1", "--bootstrap", "5")
    assert code == 0, err
    assert "1 runs" in out
    written = {p.rsplit("/", 1)[1] for p in s3fs.S3FileSystem().ls(f"{url}/runs/s1/analysis")}
    assert written == {"loss_vs_compute.png", "loss_curves.png", "report.txt"}
    report = s3fs.S3FileSystem().cat(f"{url}/runs/s1/analysis/report.txt").decode()
    assert report.startswith("ladder s1: 1 runs") and "the fits need >= 2 sizes" in report


def test_credentials_reach_no_log_config_dump_or_run_dir(
    s3_server,  # noqa: F811
    make_shards,
    random_texts,
    run_script,
    tiny_args,
    tmp_path,
    monkeypatch,
):
    """S3 and W&B keys from the environment: none reaches the output or any file of a tracked
    run (config dump, run.json, metrics, checkpoints, W&B's offline records and logs)."""
    wandb_key = "wandb-test-key-0123456789abcdef01234567"
    monkeypatch.setenv("WANDB_API_KEY", wandb_key)
    url = s3_server.upload(make_shards(random_texts(40)), "shards/secret-check")
    run_dir = tmp_path / "run"
    code, out, err = run_script(
        "trainer_core/train/__main__.py",
        *tiny_args(run_dir, f"--data.shards={url}", "--data.seq_len=16"),
        "--trainer.global_batch_size=64",
        "--trainer.max_steps=4",
        "--trainer.eval_interval=2",
        "--trainer.log_interval=1",
        "--tracking.wandb=true",
    )
    assert code == 0, err
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "metrics.jsonl" for p in written)
    assert list(run_dir.glob("wandb/offline-run-*/*.wandb"))  # W&B did write its records
    for secret in (SECRET, os.environ["AWS_ACCESS_KEY_ID"], wandb_key):
        assert secret not in out + err
        assert [p for p in written if secret.encode() in p.read_bytes()] == []


@pytest.mark.parametrize("held", ["__0_0.distcp", ".done-rank0-of-1"])
def test_a_run_on_s3_killed_mid_upload_resumes_past_the_torn_checkpoint(
    s3_server,  # noqa: F811
    processes,
    tiny_args,
    tiny_config,
    tmp_path,
    held,
):
    """The run dir is a URL. The process is killed while it uploads step 10's checkpoint (the
    server holds the upload of its tensors, or of its commit marker once the tensors are all
    there): the torn step 10 is never loaded; the resumed run starts from step 5 and ends where
    an uninterrupted local run does, and the metrics on S3 hold each step once."""
    args = ("--trainer.max_steps=15", "--checkpoint.save_interval_steps=5")
    reference = build_trainer(tiny_config(tmp_path / "local", *args)).fit()
    url = f"s3://{s3_server.bucket}/runs/torn-{held.strip('._')}"
    log = tmp_path / "killed.log"
    with s3_server.hold_upload(f"/step-00000010/{re.escape(held)}$") as reached:
        proc = processes.start(
            sys.executable, "-m", "trainer_core.train", *tiny_args(url, *args), log=log
        )
        processes.wait_until(reached.is_set, proc, log, timeout=180)
        processes.kill(proc)
    torn = s3_objects(f"{url}/checkpoints/step-00000010")
    assert held not in torn and ".done-rank0-of-1" not in torn
    if held == ".done-rank0-of-1":
        assert {".metadata", "__0_0.distcp", "info.json"} <= set(torn)
    assert [c.step for c in list_checkpoints(url) if c.complete] == [5]

    with pytest.warns(UserWarning, match=r"skipping incomplete checkpoint .*step-00000010"):
        resumed = build_trainer(tiny_config(url, *args)).fit()
    assert resumed["train/loss_last"] == pytest.approx(reference["train/loss_last"], abs=1e-6)
    assert resumed["eval/loss"] == pytest.approx(reference["eval/loss"], abs=1e-6)
    objects = s3_objects(url)
    steps = [json.loads(line)["step"] for line in objects["metrics.jsonl"].splitlines()]
    assert steps == [5, 10, 15]
    assert json.loads(objects["run.json"])["status"] == "finished"
    assert [(c.step, c.complete) for c in list_checkpoints(url)] == [(15, True)]
    assert "metrics_step15.json" in objects and "config.yaml" in objects
    assert [k for k, v in objects.items() if SECRET.encode() in v] == []


def test_move_on_s3_moves_a_prefix_or_a_single_object(s3_server):  # noqa: F811
    """A prefix has no object of its own on S3: the move copies every object under it (nested
    keys and empty "dir/" markers too) to the same relative key, then deletes the source; a
    single object moves alike."""
    fs = s3fs.S3FileSystem()
    root = f"s3://{s3_server.bucket}/move"
    fs.pipe({f"{root}/a/x": b"1", f"{root}/a/sub/y": b"22", f"{root}/ab": b"not under a/"})
    fs.pipe_file(f"{root}/a/empty/", b"")
    storage.move(f"{root}/a", f"{root}/b")
    assert s3_objects(root) == {"b/x": b"1", "b/sub/y": b"22", "ab": b"not under a/"}
    assert not storage.is_dir(f"{root}/a") and storage.is_dir(f"{root}/b/empty")
    storage.move(f"{root}/b/x", f"{root}/c")
    fs.invalidate_cache()  # s3_objects's client (this one) listed the prefix before the move
    assert s3_objects(root) == {"b/sub/y": b"22", "c": b"1", "ab": b"not under a/"}


def test_a_corrupt_latest_checkpoint_on_s3_is_set_aside_and_the_one_before_loaded(
    s3_server,  # noqa: F811
    caplog,
):
    """As on local disk: the corrupt step is moved (copied, then deleted) to
    ``step-N.corrupt-<token>``, once, and the run resumes from the step before."""
    url = f"s3://{s3_server.bucket}/runs/corrupt"
    ckpt = Checkpointer(url, CheckpointConfig())
    for step in (1, 2, 3):
        ckpt.save(step, _tiny_state(step), tokens=10 * step, permanent=True)
    fs = s3fs.S3FileSystem()
    flipped = f"{url}/checkpoints/step-00000003/__0_0.distcp"
    raw = bytearray(fs.cat(flipped))
    raw[len(raw) // 2] ^= 0xFF
    fs.pipe(flipped, bytes(raw))
    state = _tiny_state(0)
    with caplog.at_level(logging.WARNING, logger="trainer_core.checkpoint"):
        assert Checkpointer(url, CheckpointConfig()).load_latest(state).step == 2
    assert f"checkpoint {url}/checkpoints/step-00000003 is corrupt: __0_0.distcp" in caplog.text
    assert torch.equal(state["weights"]["w"], _tiny_state(2)["weights"]["w"])
    assert [c.step for c in list_checkpoints(url)] == [1, 2]
    steps = {key.split("/")[0] for key in s3_objects(f"{url}/checkpoints")}
    [aside] = steps - {"step-00000001", "step-00000002"}
    assert re.fullmatch(r"step-00000003\.corrupt-[0-9a-f]{8}", aside)
    assert s3_objects(f"{url}/checkpoints/{aside}")["__0_0.distcp"] == bytes(raw)


def _tiny_state(step: int) -> dict:
    torch.manual_seed(step)
    return {"weights": {"w": torch.randn(4, 3)}, "trainer": {"step": step, "tokens": 10 * step}}


def test_a_ladder_into_a_missing_bucket_stops_before_any_trial(
    s3_server,  # noqa: F811
    run_script,
    tiny_experiment,
):
    config = tiny_experiment("exp", dir="s3://rayladder-no-such-bucket/exp", sizes=["1M"])
    code, _, err = run_script(LADDER, "--config", str(config))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: dir: s3://rayladder-no-such-bucket/exp is not writable (")
    assert "check the bucket name and the credentials" in err and SECRET not in err


def test_a_tracked_run_on_s3_keeps_its_wandb_files_through_a_crash_and_another_node(
    s3_server,  # noqa: F811
    tiny_config,
    tmp_path,
    monkeypatch,
):
    """W&B writes on the node and the files were uploaded only at a clean end: a run killed or
    stopped early left none in the bucket. Now each checkpoint (and the loop's end, however it
    ends) uploads them, and a restart on another node (a new stage) logs the steps after those
    the bucket's W&B files hold, from its checkpoint on (W&B's file may lag the rows handed to
    it: those are logged again, not lost)."""
    from stops import StopAfter

    from trainer_core.io.storage import STAGE_ENV

    url = f"s3://{s3_server.bucket}/runs/tracked"
    args = ("--tracking.wandb=true", "--trainer.max_steps=12", "--trainer.log_interval=1")
    cfg = tiny_config(url, *args, "--checkpoint.save_interval_steps=4")
    monkeypatch.setenv(STAGE_ENV, str(tmp_path / "node-a"))
    with pytest.raises(KeyboardInterrupt):
        build_trainer(cfg, extra_callbacks=[StopAfter(7)]).fit()
    first = s3_objects(f"{url}/wandb")
    run_id, step = first["rayladder-logged-step"].decode().split()
    assert step == "7"
    assert [k for k in first if k.startswith("offline-run-") and k.endswith(".wandb")]
    monkeypatch.setenv(STAGE_ENV, str(tmp_path / "node-b"))
    build_trainer(cfg).fit()
    rows = bucket_history(url, tmp_path / "copy")
    steps = [row["_step"] for _, _, row in rows]
    assert steps == sorted(set(steps)) and {i for _, i, _ in rows} == {run_id}
    held = max((row["_step"] for segment, _, row in rows if segment != rows[-1][0]), default=0)
    assert [row["_step"] for segment, _, row in rows if segment == rows[-1][0]] == list(
        range(max(held, 4) + 1, 13)  # resumed from the checkpoint at step 4
    )

    # The run deleted and a new one launched at the URL on node b, whose stage still holds the
    # old run's files and marker: they are left out, and the new run logs from step 1.
    s3fs.S3FileSystem().rm(url, recursive=True)
    build_trainer(tiny_config(url, *args, "--trainer.max_steps=3")).fit()
    rows = bucket_history(url, tmp_path / "copy-2")
    assert [row["_step"] for _, _, row in rows] == [1, 2, 3]
    assert {i for _, i, _ in rows} - {run_id}


def bucket_history(url: str, copy) -> list:
    """W&B's history rows as the bucket holds them (copied here to be read)."""
    from wandb_history import history

    for key, data in s3_objects(f"{url}/wandb").items():
        (copy / "wandb" / key).parent.mkdir(parents=True, exist_ok=True)
        (copy / "wandb" / key).write_bytes(data)
    return history(copy)
