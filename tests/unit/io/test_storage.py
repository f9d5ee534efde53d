"""The local-path-or-URL seam (trainer_core/io/storage.py) on local disk, and the errors a URL gets
when this machine cannot write there (a real S3 server: tests/e2e/test_object_storage.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_core.config.loader import ConfigError
from trainer_core.io import storage
from trainer_core.io.output_dir import check_output_dir


def test_names_of_urls_stay_urls_and_paths_stay_paths(tmp_path):
    url = "s3://bucket/exp/runs/1M/"
    assert storage.normalize(url) == "s3://bucket/exp/runs/1M"
    assert storage.join(storage.normalize(url), "checkpoints", "step-1") == (
        "s3://bucket/exp/runs/1M/checkpoints/step-1"
    )
    assert storage.name(url) == "1M" and storage.parent(url) == "s3://bucket/exp/runs"
    assert storage.sibling("s3://b/c/step-1", "step-1.corrupt-x") == "s3://b/c/step-1.corrupt-x"
    assert storage.join(tmp_path, "a", "b") == tmp_path / "a" / "b"
    assert storage.sibling(tmp_path / "a", "b") == tmp_path / "b"


def test_entries_write_atomic_move_and_remove_on_disk(tmp_path):
    storage.makedirs(tmp_path / "d" / "sub")
    storage.write_atomic(tmp_path / "d" / "f.json", "{}")
    storage.write_atomic(tmp_path / "d" / "f.json", '{"a": 1}')
    assert storage.entries(tmp_path / "d") == {"f.json": 8, "sub": None}
    assert storage.entries(tmp_path / "absent") == {}
    assert storage.read_text(tmp_path / "d" / "f.json") == '{"a": 1}'
    assert not list((tmp_path / "d").glob("*.tmp"))
    storage.move(tmp_path / "d", tmp_path / "e")
    assert storage.is_file(tmp_path / "e" / "f.json") and not storage.is_dir(tmp_path / "d")
    storage.remove(tmp_path / "e")
    storage.remove(tmp_path / "e")  # already gone: nothing to do
    assert not Path(tmp_path / "e").exists()


def test_stage_dirs_are_per_url_and_under_the_configured_root(tmp_path, monkeypatch):
    monkeypatch.setenv(storage.STAGE_ENV, str(tmp_path))
    a = storage.upload_cache_dir("s3://bucket/run-a", "checkpoints")
    b = storage.upload_cache_dir("s3://bucket/run-b", "checkpoints")
    assert a != b and a.is_dir() and a.is_relative_to(tmp_path)
    assert storage.upload_cache_dir("s3://bucket/run-a", "checkpoints") == a


def test_a_url_without_its_filesystem_package_is_one_line_naming_the_setting():
    with pytest.raises(ConfigError) as err:
        check_output_dir("gs://bucket/runs/ladder", "dir")
    message = str(err.value)
    assert message.startswith("dir: gs://bucket/runs/ladder: no filesystem for this URL")
    assert "pip install gcsfs" in message and "\n" not in message


def test_upload_dir_sends_only_files_changed_since_the_last_upload(tmp_path):
    """W&B's dir goes up at every checkpoint and at the end: its written-once files once."""
    import fsspec

    url = f"memory://upload-{tmp_path.name}"
    fs = fsspec.filesystem("memory")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "config.yaml").write_text("a: 1\n")
    (tmp_path / "run.wandb").write_bytes(b"rows 1")
    sent = storage.upload_dir(tmp_path, url)
    assert fs.cat(f"{url}/files/config.yaml") == b"a: 1\n"
    fs.pipe_file(f"{url}/files/config.yaml", b"left alone")  # tells whether it is sent again
    (tmp_path / "run.wandb").write_bytes(b"rows 1, 2")
    again = storage.upload_dir(tmp_path, url, sent)
    assert fs.cat(f"{url}/run.wandb") == b"rows 1, 2"
    assert fs.cat(f"{url}/files/config.yaml") == b"left alone"
    assert sorted(again) == ["files/config.yaml", "run.wandb"]
    storage.upload_dir(tmp_path, url)  # no record of what was sent: every file
    assert fs.cat(f"{url}/files/config.yaml") == b"a: 1\n"
    fs.rm(url, recursive=True)
