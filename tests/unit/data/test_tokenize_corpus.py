"""datasets/tokenize_corpus.py's parts that need no Ray: --out refused before any work, progress
lines for a log, what SIGTERM does to the stage, stages left by killed runs. The script with its
Ray step (progress from Ray Data, a rerun into an input dir, SIGTERM while Ray Data runs) is
tested whole, on a real Ray, in tests/e2e/test_ray_data.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import fsspec
import pytest
from scripts import load_script

from trainer_core.config.loader import ConfigError
from trainer_core.data.shards import read_manifest
from trainer_core.data.text_sources import ReadOptions, ReadStats, discover_inputs, write_shards
from trainer_core.data.tokenizer import ByteTokenizer
from trainer_core.io.output_dir import replace_when_complete
from trainer_core.io.sigterm import sigterm_raises_exit

SCRIPT = "datasets/tokenize_corpus.py"


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


def test_a_corpus_too_small_to_split_is_warned_of(tmp_path, capsys):
    """One document gives no validation split, and training failed later with advice to raise
    --val-fraction, which can't help."""
    tokenize = load_script(SCRIPT)
    for name, texts in (("one", ["a single document"]), ("two", ["first doc", "second doc"])):
        for i, text in enumerate(texts):
            (tmp_path / name / f"{i}.txt").parent.mkdir(exist_ok=True)
            (tmp_path / name / f"{i}.txt").write_text(text)
        files = discover_inputs([str(tmp_path / name)])
        _, totals = write_shards(files, ByteTokenizer(), tmp_path / f"{name}-out", ReadOptions())
        tokenize.print_summary(read_manifest(tmp_path / f"{name}-out"), totals, 1.0)
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert warnings == [
        "warning:    no validation documents: 1 document(s) can't be split, and evaluation in "
        "training needs some; split the corpus into more documents or files"
    ]


def test_sigterm_in_the_block_exits_143_after_the_stage_is_gone_and_restores_the_handler(
    tmp_path,
):
    """The two context managers the script wraps its Ray step in, signalled in this process:
    SIGTERM raises SystemExit(143) (by default it would end Python at once, the stage left
    beside --out), the stage is removed before it leaves the block, a second SIGTERM during that
    cleanup is ignored, and the handler from before is back afterwards (the whole script, signalled
    while in Ray Data, is tests/e2e/test_ray_data.py's)."""
    received, second_ignored = [], []

    def record(signum, frame):
        received.append(signum)

    previous = signal.signal(signal.SIGTERM, record)
    try:
        with (
            pytest.raises(SystemExit) as done,
            sigterm_raises_exit(),
            replace_when_complete(tmp_path / "out") as stage,
        ):
            (stage / "part-00000.parquet").write_text("half written")
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                pytest.fail("SIGTERM did not raise")
            except SystemExit:
                os.kill(os.getpid(), signal.SIGTERM)
                second_ignored.append(True)  # not reached if the second one raised again
                raise
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (done.value.code, second_ignored, received, after) == (143, [True], [], record)
    assert list(tmp_path.iterdir()) == [], "no stage and no out left"


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


def test_a_dir_with_another_kind_of_manifest_is_refused_and_kept(run_script, tmp_path):
    """Any file named manifest.json once passed as proof of a shard dir, and the replace deleted
    the project around it."""
    (tmp_path / "doc.txt").write_text("text")
    project = tmp_path / "myproject"
    project.mkdir()
    (project / "manifest.json").write_text('{"name": "my web app"}')
    (project / "notes.txt").write_text("notes")
    code, out, err = run_script(SCRIPT, "--input", str(tmp_path / "doc.txt"), "--out", str(project))
    assert (code, out) == (2, "")
    assert err == (
        f"error: --out: {project / 'manifest.json'} is not a shard manifest, and only a shard "
        "dir is replaced; choose a new or empty dir\n"
    )
    assert sorted(p.name for p in project.iterdir()) == ["manifest.json", "notes.txt"]


def test_a_shard_dir_holding_other_files_is_refused_naming_them(tmp_path):
    """Replacing a shard dir deletes all of it: only one holding nothing but this command's files
    (shards, manifest, tokenizer) is replaced."""
    tokenize = load_script(SCRIPT)
    (tmp_path / "doc.txt").write_text("some text to tokenize")
    shards = tmp_path / "shards"
    write_shards(
        discover_inputs([str(tmp_path / "doc.txt")]), ByteTokenizer(), shards, ReadOptions()
    )
    ByteTokenizer().save(shards)
    assert tokenize.check_out(str(shards)) == shards
    (shards / "notes.txt").write_text("mine")
    (shards / "eval").mkdir()
    with pytest.raises(ConfigError) as refused:
        tokenize.check_out(str(shards))
    assert str(refused.value) == (
        f"--out: {shards} is a shard dir but also holds eval, notes.txt, which replacing it "
        "would delete; move them out or choose another --out"
    )
    assert (shards / "notes.txt").read_text() == "mine"


def test_a_shard_dir_with_a_damaged_manifest_is_refused_not_sent_back_here(tmp_path):
    """Its manifest says the format but lost a field: the refusal read it whole and said "re-run
    datasets/tokenize_corpus.py", the command being run. Which files are ours can't be told."""
    tokenize = load_script(SCRIPT)
    shards = tmp_path / "shards"
    shards.mkdir()
    manifest = {"format": "rayladder-shards", "version": 1}
    (shards / "manifest.json").write_text(json.dumps(manifest))
    (shards / "part-00000.parquet").write_text("kept")
    with pytest.raises(ConfigError) as refused:
        tokenize.check_out(str(shards))
    assert str(refused.value).startswith(f"--out: {shards / 'manifest.json'} is damaged (")
    assert str(refused.value).endswith("delete the dir yourself, or choose another --out")
    assert (shards / "part-00000.parquet").read_text() == "kept"


def test_help_shows_each_default_once(run_script):
    code, out, _ = run_script(SCRIPT, "--help")
    assert code == 0
    assert "  --num-cpus NUM_CPUS   CPUs of the local Ray (default: all)\n" in out
    assert "(default: None)" not in out
