"""Does this node see the files the driver sees? A run across nodes needs its dirs on storage
that every node mounts at the same path (or object storage); a node-local path looks the same
on every node but holds different files, so runs would train, write their results on their
own node and be found missing on the driver's, with errors that point elsewhere.

The driver writes a fresh token into a mark file in the dir it owns and lists the local input
files it read (the shard manifests); each trial or worker checks both before it starts, and a
node that sees another token, no mark, or no input fails at once with one line.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from trainer_core.config.sections import DataConfig
from trainer_core.data.shards import MANIFEST
from trainer_core.data.token_data import read_mix
from trainer_core.errors import UserError
from trainer_core.io import storage
from trainer_core.io.storage import Location

MARK = ".rayladder-driver"
"""The mark file the driver writes into the dir it owns: its token."""
FIX = (
    "a run across nodes needs it on a file system every node mounts at the same path, or on "
    "object storage (s3://...); see docs/cluster.md"
)


class NodeViewError(UserError):
    """This node does not see a file the driver wrote or read."""


@dataclass(frozen=True)
class DriverView:
    """What the driver wrote (``mark`` holding ``token``) and read (``inputs``), and on which
    node, for a process on another node to check it sees the same."""

    node: str
    mark: str = ""
    token: str = ""
    inputs: tuple[tuple[str, str], ...] = ()
    """(setting, local file) pairs: a file a setting names, which the driver sees."""
    key: str = "trainer.run_dir"
    """The setting that names the dir holding ``mark``."""


def driver_view(
    owned: Location, key: str, inputs: Iterable[tuple[str, Location]] = ()
) -> DriverView:
    """Mark ``owned`` (the driver's dir, named by setting ``key``) with a fresh token, and note
    those of ``inputs``' local files the driver sees (one it does not is the driver's own error
    to report); a URL needs no check (every node reads the same store)."""
    import ray

    node = ray.util.get_node_ip_address()
    local = tuple((k, str(p)) for k, p in inputs if not storage.is_url(p) and storage.is_file(p))
    if storage.is_url(owned):
        return DriverView(node, inputs=local)
    token = secrets.token_hex(8)
    mark = storage.join(owned, MARK)
    storage.makedirs(owned)
    storage.write_atomic(mark, token)
    return DriverView(node, str(mark), token, local, key)


def data_inputs(cfg: DataConfig) -> list[tuple[str, Location]]:
    """The files ``cfg`` names that every node must read: the mix file and each shard dir's
    manifest (the demo corpus is built on each node)."""
    if cfg.mix:
        dirs = [d for d, _ in read_mix(cfg.mix)]
        return [("data.mix", cfg.mix), *(("data.mix", storage.join(d, MANIFEST)) for d in dirs)]
    if cfg.shards:
        return [("data.shards", storage.join(storage.normalize(cfg.shards, True), MANIFEST))]
    return []


def check_node_sees(view: DriverView | None) -> None:
    """Raise :class:`NodeViewError` when this node does not see ``view``'s mark (with its
    token) or one of its inputs."""
    if view is None:
        return
    import ray

    here = ray.util.get_node_ip_address()
    if view.mark and _token_at(view.mark) != view.token:
        raise NodeViewError(
            f"{view.key} {storage.parent(view.mark)}: this node ({here}) does not see the dir "
            f"the driver wrote on node {view.node}; {FIX}"
        )
    for key, path in view.inputs:
        if not storage.is_file(path):
            raise NodeViewError(
                f"{key} {path}: this node ({here}) does not see the file the driver read on "
                f"node {view.node}; {FIX}"
            )


def _token_at(mark: str) -> str | None:
    try:
        return storage.read_text(mark)
    except OSError:
        return None
