"""datasets/tokenize_corpus.py around its Ray step: --out, progress in a log, its own output
among the inputs, SIGTERM. The Ray step runs in this process instead (no Ray is started); that
it writes the same bytes is tests/e2e/test_ray_data.py's concern."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import fsspec
import pytest
from scripts import load_script

from trainer_core.data.shards import read_manifest
from trainer_core.data.text_sources import ReadStats, write_shards
from trainer_core.io.output_dir import replace_when_complete

SCRIPT = "datasets/tokenize_corpus.py"


@pytest.fixture
def tokenize_here(monkeypatch):
    """The script's Ray start and Ray Data step replaced by a loop in this process; returns a
    list of hooks, each called with the stage dir once the shards are written there."""
    import trainer_core.ray.runtime as runtime
    import trainer_core.ray.tokenization as tokenization

    hooks = []

    def tokenize(files, tokenizer, out_dir, opts, **kwargs):
        written = write_shards(files, tokenizer, out_dir, opts, **kwargs)
        for hook in hooks:
            hook(out_dir)
        return written

    monkeypatch.setattr(runtime, "init_ray", lambda *args, **kwargs: None)
    monkeypatch.setattr(tokenization, "tokenize_to_shards", tokenize)
    return hooks


def test_out_url_is_refused_before_anything_is_written(run_script, tmp_path):
    """A URL once passed the write probe (an object written and deleted in the bucket), then
    crashed with an AttributeError: the shards are written in place and swapped in by a rename."""
    (tmp_path / "doc.txt").write_text("text")
    code, out, err = run_script(SCRIPT, "--input", str(tmp_path), "--out", "memory://b/shards")
    assert (code, out) == (2, "")
    assert err == (
        "error: --out: memory://b/shards is a URL, but --out must be a local or shared-filesystem "
        "dir; build the shards locally, upload the finished dir, and point data.shards at it\n"
    )
    assert not fsspec.filesystem("memory").exists("/b")


def test_progress_in_a_log_is_plain_lines(capsys):
    """A live bar prints nothing where stdout is no terminal (ray job logs, a redirect)."""
    tokenize = load_script(SCRIPT)
    with tokenize.file_progress(20) as on_file:
        assert isinstance(on_file, tokenize.PlainProgress), "capsys's stdout is no terminal"
    now = [0.0]
    progress = tokenize.PlainProgress(20, clock=lambda: now[0])
    for file in range(1, 21):
        now[0] += 30.0 if file == 5 else 1.0  # file 5 takes 30 s: a line although no tenth ends
        progress(ReadStats(files=1, documents=3, text_bytes=100_000))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        f"tokenizing: {n}/20 files" for n in (2, 4, 5, 6, 8, 10, 12, 14, 16, 18, 20)
    ]
    assert lines[2] == "tokenizing: 5/20 files, 0.5 MB, 15 documents, 34 s"


def test_a_rerun_into_an_input_dir_leaves_its_shards_out_and_logs_each_stage(
    run_script, tokenize_here, tmp_path
):
    """--out inside an --input dir: the second run once read the first one's shards as text."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"{i}.txt").write_text(f"document {i} " * 20)
    out = corpus / "shards"
    args = ["--input", str(corpus), "--out", str(out)]
    assert run_script(SCRIPT, *args)[0] == 0
    code, stdout, err = run_script(SCRIPT, *args, "--train-bpe", "300")
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


def test_sigterm_while_writing_removes_the_stage(run_script, tokenize_here, tmp_path):
    """ray job stop and kill send SIGTERM, whose default ends Python at once: the half-written
    stage dir stayed beside --out for ever."""
    (tmp_path / "doc.txt").write_text("text")
    tokenize_here.append(lambda stage: os.kill(os.getpid(), signal.SIGTERM))
    received = []

    def record(signum, frame):
        received.append(signum)

    previous = signal.signal(signal.SIGTERM, record)
    try:
        code, _, _ = run_script(
            SCRIPT, "--input", str(tmp_path / "doc.txt"), "--out", str(tmp_path / "out")
        )
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (code, received, after) == (143, [], record), "exits; the handler before is back"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.txt"], "no stage and no --out left"


def test_a_stage_left_by_a_killed_run_is_removed_by_the_next(tmp_path):
    """SIGKILL or the OOM killer leave a stage no handler could remove; the next run removes
    those of dead processes of this host, and nothing else."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    host = socket.gethostname()
    left = f".out.staging-{host}-{gone.stdout.strip()}-abc123"
    kept = [
        f".out.staging-{host}-{os.getpid()}-abc123",  # a live process's
        f".out.staging-not-{host}-{gone.stdout.strip()}-abc123",  # another host's
        ".out.staging-mine",  # not a name this code makes
        f".other.staging-{host}-{gone.stdout.strip()}-abc123",  # another --out's
    ]
    for name in [left, *kept]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "part-00000.parquet").write_text("x")
    with replace_when_complete(tmp_path / "out") as stage:
        (stage / "new").write_text("y")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "out"])
