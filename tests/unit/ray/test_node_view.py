"""A node that does not see the driver's files fails at once, naming the setting: a node-local
dir on a multi-node cluster once split a ladder's results across nodes and then failed the
analysis with "run dir without run.json ... rerun with --resume"."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainer_core.config.sections import DataConfig
from trainer_core.ray.node_view import (
    MARK,
    NodeViewError,
    check_node_sees,
    data_inputs,
    driver_view,
)

FIX = "on a file system every node mounts at the same path, or on object storage (s3://...)"


def test_the_drivers_own_node_sees_its_view(tmp_path: Path):
    view = driver_view(tmp_path / "run", "trainer.run_dir")
    assert (tmp_path / "run" / MARK).read_text() == view.token
    check_node_sees(view)


@pytest.mark.parametrize("there", ["another token", None])
def test_a_node_with_its_own_copy_of_the_dir_is_refused(tmp_path: Path, there: str | None):
    """Another node's local dir at the same path: no mark there, or one another launch wrote."""
    view = driver_view(tmp_path / "exp", "dir")
    if there is None:
        (tmp_path / "exp" / MARK).unlink()
    else:
        (tmp_path / "exp" / MARK).write_text(there)
    with pytest.raises(NodeViewError) as refused:
        check_node_sees(dataclasses.replace(view, node="10.0.0.1"))
    message = str(refused.value)
    assert message.startswith(f"dir {tmp_path / 'exp'}: this node (")
    assert ") does not see the dir the driver wrote on node 10.0.0.1; a run across nodes" in message
    assert FIX in message


def test_a_node_without_the_drivers_shards_is_refused_naming_the_setting(tmp_path: Path):
    """The shards were once "no shard manifest there; create shards with ...", though they
    existed: on the driver's node."""
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text("{}")
    inputs = data_inputs(DataConfig(shards=str(shards)))
    assert inputs == [("data.shards", shards / "manifest.json")]
    view = driver_view(tmp_path / "run", "trainer.run_dir", inputs)
    check_node_sees(view)
    (shards / "manifest.json").unlink()
    with pytest.raises(NodeViewError) as refused:
        check_node_sees(view)
    assert str(refused.value).startswith(
        f"data.shards {shards / 'manifest.json'}: this node ("
    ) and str(refused.value).endswith(
        f"does not see the file the driver read on node "
        f"{view.node}; a run across nodes needs it {FIX}; see "
        "docs/cluster.md"
    )


def test_a_mix_names_its_file_and_each_dirs_manifest(tmp_path: Path):
    mix = tmp_path / "mix.yaml"
    mix.write_text("a: 0.7\nb: 0.3\n")
    assert data_inputs(DataConfig(mix=str(mix))) == [
        ("data.mix", str(mix)),
        ("data.mix", tmp_path / "a" / "manifest.json"),
        ("data.mix", tmp_path / "b" / "manifest.json"),
    ]
    assert data_inputs(DataConfig()) == []


def test_object_storage_needs_no_mark_and_a_missing_input_is_the_drivers_own_error(
    tmp_path: Path,
):
    view = driver_view("s3://bucket/exp", "dir", [("data.shards", tmp_path / "none.json")])
    assert (view.mark, view.inputs) == ("", ())
    check_node_sees(view)
