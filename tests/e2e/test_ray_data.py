"""Ray Data: the per-rank reader equals the local one; the tokenize pipeline and script."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from test_ray_train import console

from trainer_core.config.sections import DataConfig
from trainer_core.data.shards import DataError, ShardError, read_manifest, verify_shards
from trainer_core.data.text_sources import ReadOptions, discover_inputs, write_shards
from trainer_core.data.token_data import open_token_data
from trainer_core.data.tokenizer import ByteTokenizer
from trainer_core.ray import reader as ray_data
from trainer_core.ray.reader import batches_from_shard, ray_train_dataset
from trainer_core.ray.tokenization import tokenize_to_shards

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_ray_reader_rows_equal_local_batches_per_rank(
    ray_session, make_shards, random_texts, monkeypatch
):
    data = open_token_data(DataConfig(shards=str(make_shards(random_texts(60)))), 320)
    seq, batch, start, steps = 16, 6, 57, 5
    monkeypatch.setattr(ray_data, "BLOCK_TOKENS", 2 * 3 * (seq + 1))  # 2 steps a block: 3 blocks
    for rank in range(2):
        ds = ray_train_dataset(data.spec, seq, batch, 11, start, steps, rank, 2)
        assert ds.materialize().num_blocks() == 3
        rows = ds.take_all()
        assert [(r["step"], r["slot"]) for r in rows] == [
            (s, i) for s in range(start, start + steps) for i in range(3)
        ]
        got = list(batches_from_shard(ds, 3, expected_start_step=start))
        local = list(itertools.islice(data.train_batches(seq, batch, 11, start, rank, 2), steps))
        assert len(got) == steps
        assert all(
            g.dtype == torch.int64 and torch.equal(g, x) for g, x in zip(got, local, strict=True)
        )
    with pytest.raises(
        DataError, match=f"dataset starts at step {start} but training resumes at step 3"
    ):
        next(
            batches_from_shard(
                ray_train_dataset(data.spec, seq, batch, 11, start, 1, 0, 2),
                3,
                expected_start_step=3,
            )
        )


def test_corrupt_shard_stops_the_ray_reader_in_one_line(
    ray_session, make_shards, random_texts, capfd, ray_log
):
    """The consumer gets the ShardError itself, in one line, and the console shows nothing
    more: Ray Data logged it as an internal error (with "open an issue" and two tracebacks)."""
    shards = make_shards(random_texts(60))
    data = open_token_data(DataConfig(shards=str(shards)), 320)
    part = shards / "part-00002.parquet"
    chunk = pq.ParquetFile(part).metadata.row_group(0).column(0)
    raw = bytearray(part.read_bytes())
    raw[chunk.data_page_offset + chunk.total_compressed_size - 1] ^= 0x10
    part.write_bytes(raw)
    epoch_steps = data.train[0].num_windows(16) // 6 + 1
    with pytest.raises(ShardError) as caught:
        list(batches_from_shard(ray_train_dataset(data.spec, 16, 6, 0, 0, epoch_steps, 0, 1), 6))
    assert type(caught.value) is ShardError
    assert str(caught.value).startswith(f"{part}: row group 0 is corrupt (could not verify page")
    assert "\n" not in str(caught.value)
    shown = console(capfd, ray_log)
    assert "Traceback" not in shown and "open an issue on the Ray project" not in shown, shown


def test_blocks_are_regrouped_into_whole_steps():
    rows = np.arange(10)
    blocks = [{"step": rows[a:b] // 3, "slot": rows[a:b] % 3} for a, b in [(0, 2), (2, 7), (7, 9)]]
    got = list(ray_data._whole_steps(iter(blocks), 3))
    assert [g["step"].tolist() for g in got] == [[0, 0, 0, 1, 1, 1], [2, 2, 2]]
    assert [g["slot"].tolist() for g in got] == [[0, 1, 2, 0, 1, 2], [0, 1, 2]]
    with pytest.raises(DataError, match="ended 1 rows into a step of 3 rows"):
        list(ray_data._whole_steps(iter([*blocks, {"step": rows[9:], "slot": rows[9:]}]), 3))


def test_ray_pipeline_writes_the_same_shards_as_in_process(ray_session, tmp_path, random_texts):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(random_texts(12)):
        (corpus / f"{i:02d}.jsonl").write_text(
            json.dumps({"text": text}) + "\n" + json.dumps({"text": text[::-1]}) + "\n"
        )
    files = discover_inputs([str(corpus)])
    kw = dict(val_fraction=0.2, shard_tokens=1000)
    seen = []
    ray_manifest, stats = tokenize_to_shards(
        files, ByteTokenizer(), tmp_path / "ray", ReadOptions(), on_file=seen.append, **kw
    )
    local_manifest, _ = write_shards(
        files, ByteTokenizer(), tmp_path / "local", ReadOptions(), **kw
    )
    assert [f.sha256 for f in ray_manifest.train + ray_manifest.validation] == [
        f.sha256 for f in local_manifest.train + local_manifest.validation
    ]
    assert (stats.files, stats.documents, len(seen)) == (12, 24, 12)
    (corpus / "05.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match=r"05\.jsonl line 1: no field 'text'"):
        tokenize_to_shards(files, ByteTokenizer(), tmp_path / "bad", ReadOptions(), **kw)


def test_tokenize_script_from_a_shell_writes_a_valid_manifest(processes, tmp_path, random_texts):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(random_texts(6)):
        (corpus / f"{i}.txt").write_text(text)
    (corpus / "more.jsonl").write_text(json.dumps({"text": "a json document"}) + "\n")
    out = tmp_path / "shards"
    result = processes.python(
        "datasets/tokenize_corpus.py",
        "--input",
        str(corpus / "*.txt"),
        "--input",
        str(corpus / "*.jsonl"),
        "--out",
        str(out),
        "--num-cpus",
        "1",
    )
    assert result.returncode == 0, result.stderr
    manifest = verify_shards(out)
    assert sum(f.documents for f in manifest.train + manifest.validation) == 7
    assert manifest.tokenizer.kind == "byte" and (out / "byte_tokenizer.json").is_file()
    assert "7 files, 7 documents" in result.stdout and "MB/s" in result.stdout
    assert (
        open_token_data(DataConfig(shards=str(out), seq_len=8), 320).num_train_tokens
        == manifest.num_train_tokens
    )


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_failed_tokenize_leaves_every_dir_as_it_was(
    ray_session, run_script, tmp_path, random_texts
):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(random_texts(4)):
        (corpus / f"{i}.txt").write_text(text)
    (tmp_path / "bad.jsonl").write_text("not json\n")
    out = tmp_path / "shards"
    assert (
        run_script("datasets/tokenize_corpus.py", "--input", str(corpus), "--out", str(out))[0] == 0
    )
    before, listing = snapshot(out), sorted(p.name for p in tmp_path.iterdir())
    for target in (out, tmp_path / "new" / "shards"):
        code, _, err = run_script(
            "datasets/tokenize_corpus.py",
            "--input",
            str(tmp_path / "bad.jsonl"),
            "--out",
            str(target),
        )
        assert code == 2 and err.startswith("error: ") and "bad.jsonl line 1" in err
        assert err.count("\n") == 1
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing, "no stage or empty dir left"


def test_tokenize_rerun_replaces_the_whole_dir(ray_session, run_script, tmp_path, random_texts):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(random_texts(20)):
        (corpus / f"{i}.txt").write_text(text)
    out = tmp_path / "shards"
    args = ["--input", str(corpus), "--out", str(out), "--val-fraction", "0.2"]
    assert run_script("datasets/tokenize_corpus.py", *args, "--train-bpe", "300")[0] == 0
    assert (out / "tokenizer.json").is_file()
    assert run_script("datasets/tokenize_corpus.py", *args, "--shard-tokens", "5000")[0] == 0
    manifest = verify_shards(out)
    written = {f.name for f in manifest.train + manifest.validation}
    assert {p.name for p in out.iterdir()} == {*written, "manifest.json", "byte_tokenizer.json"}
    assert manifest.tokenizer.kind == "byte" and manifest.page_checksums
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "shards"]


def test_a_rerun_into_an_input_dir_leaves_its_shards_out_and_logs_each_stage(
    ray_session, run_script, tmp_path
):
    """--out inside an --input dir: the second run once read the first one's shards as text.
    Each stage prints a line; the tokenizing ones come from Ray Data's per-file counts, so they
    show that the pipeline reports every file, in input order."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"{i}.txt").write_text(f"document {i} " * 20)
    out = corpus / "shards"
    args = ["--input", str(corpus), "--out", str(out)]
    assert run_script("datasets/tokenize_corpus.py", *args)[0] == 0
    code, stdout, err = run_script("datasets/tokenize_corpus.py", *args, "--train-bpe", "300")
    assert (code, err) == (0, "")
    manifest = read_manifest(out)
    assert manifest.tokenizer.kind == "hf" and manifest.info["read"]["files"] == 3
    lines = stdout.splitlines()
    assert [re.sub(r", \d+ s$", "", line) for line in lines[:6]] == [
        f"left out:   {out}: a shard dir (tokens, not text)",
        "training:   a BPE of vocab 300 on <= 64 MB of the text",
        "tokenizing: 1/3 files, 0.0 MB, 1 documents",
        "tokenizing: 2/3 files, 0.0 MB, 2 documents",
        "tokenizing: 3/3 files, 0.0 MB, 3 documents",
        f"verifying:  {len(manifest.train) + len(manifest.validation)} shard files",
    ]
    assert lines[6].startswith(f"shards:     {out} (")


def test_sigterm_while_writing_removes_the_stage_and_keeps_the_old_shards(
    processes, make_shards, random_texts, tmp_path
):
    """kill and ray job stop send SIGTERM, whose default ends Python at once: the half-written
    stage beside --out stayed there for ever. Here the script runs as a user runs it, on its own
    local Ray, and is signalled once its stage holds shards, while the driver alternates between
    waiting in Ray Data's iterator and writing; it must exit with sigterm_raises_exit's 143, not
    Ray's own SIGTERM status, leave no stage, and leave the shard dir it was replacing as it was.

    800,000 short documents keep Ray Data busy for seconds after the first shard is written
    (documents, not bytes, cost time here), while the run up to that point does not depend on
    the input's size. The signal goes to the script's process alone, as ``kill PID`` sends it:
    its group also holds the Ray it started, which ``ray job stop`` (whose group is the entry
    point's) never signals, and whose lost GCS makes the driver's exit wait seconds longer."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in range(40):
        lines = (f'{{"text": "document {d} of file {f}"}}\n' for d in range(20_000))
        (corpus / f"{f:02d}.jsonl").write_text("".join(lines))
    out = make_shards(random_texts(20))
    before = snapshot(out)
    log = tmp_path / "tokenize.log"
    proc = processes.start(
        sys.executable,
        "datasets/tokenize_corpus.py",
        "--input",
        str(corpus),
        "--out",
        str(out),
        "--shard-tokens",
        "100000",
        "--num-cpus",
        "1",
        log=log,
    )
    name, host = re.escape(out.name), re.escape(socket.gethostname())
    stage_name = re.compile(rf"\.{name}\.staging-{host}-{proc.pid}-[0-9a-f]{{6}}")

    def stages() -> list[Path]:
        return [p for p in tmp_path.iterdir() if stage_name.fullmatch(p.name)]

    processes.wait_until(
        lambda: any(shard for stage in stages() for shard in stage.glob("*.parquet")),
        proc,
        log,
        timeout=120,
    )
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 143, log.read_text()[-3000:]
    assert "verifying:" not in log.read_text(), "signalled too late: all shards were written"
    assert stages() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "shards", "tokenize.log"]
    assert snapshot(out) == before
