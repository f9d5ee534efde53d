"""Reading a checkpoint without unpickling arbitrary objects, and naming what does not fit.

DCP 2.13 reads ``.metadata`` with plain ``pickle.load`` and non-tensor items with
``torch.load(weights_only=False)``; both are replaced here by an allow-listed unpickler and
``weights_only=True``.
"""

from __future__ import annotations

import io
import pickle
import re
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from trainer_core.checkpoint.listing import CheckpointError
from trainer_core.io import storage
from trainer_core.io.storage import Location

_MAX_LISTED = 20


_METADATA_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("collections", "OrderedDict"),
}
_PATH_CLASSES = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` (dataclasses, dtypes, paths) and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            (module, name) in _METADATA_GLOBALS
            or module == "torch.distributed.checkpoint.metadata"
            or (module.startswith("pathlib") and name in _PATH_CLASSES)
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")
        return super().find_class(module, name)


class _SafeMetadata:
    """DCP's reader with ``.metadata`` read through :class:`_MetadataUnpickler` (for both the
    local reader and the fsspec one, which streams a checkpoint straight from object storage)."""

    path: Any
    load_id: Any

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        with storage.open_file(storage.join(str(self.path), name)) as f:
            metadata = _MetadataUnpickler(f).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(
                f"{name} holds a {type(metadata).__name__}, not DCP Metadata"
            )
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafeReader(_SafeMetadata, dcp.FileSystemReader):
    pass


class _SafeRemoteReader(_SafeMetadata, FsspecReader):
    pass


def _safe_reader(path: Location) -> dcp.FileSystemReader:
    return (_SafeRemoteReader if storage.is_url(path) else _SafeReader)(str(path))


class _SafeLoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's planner loads non-tensor items with ``weights_only=False``; this one never does."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def read_metadata(path: Location) -> Metadata:
    """A checkpoint's DCP metadata, read with the allow-listed unpickler."""
    try:
        return _safe_reader(path).read_metadata()
    except Exception as e:  # truncated, foreign or malicious .metadata
        raise CheckpointError(f"checkpoint {path} has an unreadable .metadata ({e})") from None


def _reading_order(key: str) -> tuple[int, str]:
    """Non-layer and first-layer keys first, so a capped list shows one of each kind."""
    return max((int(part) for part in key.split(".") if part.isdigit()), default=0), key


def _root_cause(e: BaseException) -> str:
    """One line per failing rank instead of DCP's tracebacks and torch.load's generic advice."""
    if isinstance(e, CheckpointException):
        return "; ".join(
            f"rank {r}: {_root_cause(exc)}" for r, (exc, _) in sorted(e.failures.items())
        )
    text = str(e)
    unsafe = re.search(r"GLOBAL (\S+) was not an allowed global", text)
    if unsafe:
        return (
            f"refusing to unpickle {unsafe.group(1)}: non-tensor items load with weights_only=True"
        )
    detail = re.search(r"WeightsUnpickler error:(.*?)(Check the documentation|$)", text, re.S)
    if detail:
        return f"unreadable data ({' '.join(detail.group(1).split())}): the file is corrupt"
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _listing(title: str, items: list[str]) -> list[str]:
    items = sorted(items, key=_reading_order)
    more = [f"  ... and {len(items) - _MAX_LISTED} more"] if len(items) > _MAX_LISTED else []
    return [f"  {title}: {item}" for item in items[:_MAX_LISTED]] + more


def check_compatible(path: Location, metadata: Metadata, state: dict[str, Any]) -> None:
    """Compare the saved keys and tensor shapes with ``state`` (Statefuls already resolved).

    Checkpoint keys under top-level sections that ``state`` does not ask for are ignored, so a
    partial load (e.g. model only) is allowed; ``rng`` is per rank and checked by the caller.
    """
    saved = metadata.state_dict_metadata
    flat, _ = flatten_state_dict(state)
    sections = set(state) - {"rng"}
    current = {k: v for k, v in flat.items() if k.split(".", 1)[0] in sections}
    missing = sorted(k for k in current if k not in saved)
    unexpected = sorted(k for k in saved if k.split(".", 1)[0] in sections and k not in current)
    mismatched = []
    for key in sorted(set(current) & set(saved)):
        meta, value = saved[key], current[key]
        saved_shape = list(meta.size) if isinstance(meta, TensorStorageMetadata) else "a non-tensor"
        shape = list(value.shape) if isinstance(value, torch.Tensor) else "a non-tensor"
        if saved_shape != shape:
            mismatched.append(f"{key}: checkpoint {saved_shape}, current {shape}")
    if missing or unexpected or mismatched:
        lines = [
            f"checkpoint {path} does not match the current model/optimizer state (different config?):"
        ]
        lines += _listing("shape mismatch", mismatched)
        lines += _listing("missing from checkpoint", missing)
        lines += _listing("unexpected in checkpoint", unexpected)
        raise CheckpointError("\n".join(lines))


def _prune_to_saved(value: Any, prefix: str, saved: set[str]) -> Any:
    """``value`` without the leaves whose flattened key the checkpoint lacks (None: nothing left)."""
    if not isinstance(value, dict):
        return value if prefix in saved else None
    kept = {k: _prune_to_saved(v, f"{prefix}.{k}", saved) for k, v in value.items()}
    kept = {k: v for k, v in kept.items() if v is not None}
    return kept or None
