"""Token shards and experiments on object storage, against a real S3 server on 127.0.0.1."""

from __future__ import annotations

import itertools
import json
import os

import pandas as pd
import pyarrow.parquet as pq
import pytest
import s3fs
import torch
from s3_server import SECRET, s3_server  # noqa: F401  (s3_server: the fixture)
from test_analysis import make_ladder, write_checkpoint

from trainer_core.analysis import load
from trainer_core.analysis.load import AnalysisError
from trainer_core.config import DataConfig
from trainer_core.data import open_token_data
from trainer_core.ray.reader import batches_from_shard, ray_train_dataset
from trainer_core.ray.runtime import init_ray
from trainer_core.shards import DataError, ShardError

pytestmark = pytest.mark.slow


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


def test_ray_reader_streams_shards_from_s3(s3_ray, s3_server, make_shards, random_texts):  # noqa: F811
    local_dir = make_shards(random_texts(40))
    url = s3_server.upload(local_dir, "shards/ray")
    remote = open_token_data(DataConfig(shards=url), 320)
    local = open_token_data(DataConfig(shards=str(local_dir)), 320)
    ds = ray_train_dataset(remote.spec, 16, 4, 5, 1, 3, 1, 2)
    got = list(batches_from_shard(ds, 2, expected_start_step=1))
    want = list(itertools.islice(local.train_batches(16, 4, 5, 1, 1, 2), 3))
    assert len(got) == 3 and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_analysis_reads_an_experiment_from_s3(s3_server, tmp_path, run_script):  # noqa: F811
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

    s3fs.S3FileSystem().rm(f"{url}/runs/s2/run.json")
    with pytest.raises(AnalysisError, match=f"^{url}/runs/s2: run dir without run.json"):
        load(url)
    with pytest.raises(AnalysisError, match=f"^{url}-gone: no such directory"):
        load(f"{url}-gone")

    # One run dir keeps the fits (and this test) cheap; the CLI path is the same.
    code, out, err = run_script("workflows/analyze.py", f"{url}/runs/s1", "--bootstrap", "5")
    assert code == 0, err
    assert "1 runs" in out
    plots = s3fs.S3FileSystem().ls(f"{url}/runs/s1/analysis")
    assert plots and all(p.endswith(".png") for p in plots)


def test_credentials_reach_no_log_config_dump_or_run_dir(
    s3_server,  # noqa: F811
    make_shards,
    random_texts,
    run_script,
    tiny_args,
    tmp_path,
):
    url = s3_server.upload(make_shards(random_texts(40)), "shards/secret-check")
    run_dir = tmp_path / "run"
    code, out, err = run_script(
        "trainer_core/train.py",
        *tiny_args(run_dir, f"--data.shards={url}", "--data.seq_len=16"),
        "--trainer.global_batch_size=64",
        "--trainer.max_steps=4",
        "--trainer.eval_interval=2",
        "--trainer.log_interval=1",
    )
    assert code == 0, err
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "metrics.jsonl" for p in written)
    for secret in (SECRET, os.environ["AWS_ACCESS_KEY_ID"]):
        assert secret not in out + err
        assert [p for p in written if secret.encode() in p.read_bytes()] == []
