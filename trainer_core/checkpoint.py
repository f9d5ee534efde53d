"""Sharded checkpoints: atomic commit, Levanter-style keep policy, safe loading, listing.

Layout: ``<run_dir>/checkpoints/step-XXXXXXXX/``, written with ``torch.distributed.checkpoint``
(every rank writes its own shards). All ranks write into ``step-N.tmp-<token>`` (rank 0 picks the
token and broadcasts it), each drops a marker ``.done-rank{r}-of-{W}`` once its part is on disk,
and after a barrier rank 0 renames the dir. A checkpoint is complete iff it has DCP's
``.metadata`` and all W markers, so a crash at any moment leaves the previous checkpoints plus at
most a half-written dir that :func:`latest_checkpoint` skips, never a half-written "latest".

Integrity, not only atomicity: each marker lists the files its rank wrote (rank 0: ``.metadata``
and ``info.json`` too) with their sizes and CRC32s. Each rank lists only its own files, so the
listing stays right however the files meet in one dir (a shared file system, or per-rank dirs
merged by Ray). Listing a run checks presence and size (one ``stat`` per file); loading reads
every byte against its CRC32 and, on a mismatch, names the file (see :meth:`Checkpointer.load_latest`).

The app state is a dict of Stateful objects and plain dicts. DCP keeps a single copy of a key
that several ranks save (it assumes replicated values), so everything except ``"rng"`` must be
identical on all ranks; per-rank values live under ``"rng": {"rank<r>": ...}``.

Loading never unpickles arbitrary objects: DCP 2.13 reads ``.metadata`` with plain
``pickle.load`` and non-tensor items with ``torch.load(weights_only=False)``; both are replaced
here by an allow-listed unpickler and ``weights_only=True``.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import random
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.stateful import Stateful

from trainer_core import storage
from trainer_core.checksums import FileListing, checksum_problems, list_files, size_problems
from trainer_core.config import CheckpointConfig
from trainer_core.distributed import is_distributed
from trainer_core.errors import UserError
from trainer_core.run_dir import (
    CHECKPOINTS,
    STEP_DIR,
    beside,
    checkpoints_dir,
    metrics_step_path,
    scratch_dirs,
    step_dir,
    write_metrics_step,
)
from trainer_core.storage import Location

log = logging.getLogger(__name__)
# DCP warns on every save/load without a process group (also from async save's thread); a
# single-process run is intended here.
warnings.filterwarnings(
    "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
)

Decision = Literal["none", "temporary", "permanent"]
_MAX_LISTED = 20


class CheckpointError(UserError, ValueError):
    """A checkpoint is missing, incomplete, corrupt, unsafe, or does not fit the current state."""


class CorruptCheckpointError(CheckpointError):
    """A complete checkpoint whose files no longer match the checksums listed when it was saved."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    tokens: int
    path: Location
    complete: bool
    permanent: bool
    metrics_path: Location | None


def marker_name(rank: int, world_size: int) -> str:
    return f".done-rank{rank}-of-{world_size}"


MARKER = re.compile(r"^\.done-rank(\d+)-of-(\d+)$")


def _read_json(path: Location) -> Any:
    try:
        return json.loads(storage.read_text(path))
    except (OSError, ValueError):  # absent, or not UTF-8 JSON (its listed CRC32 names it)
        return None


def _read_info(path: Location) -> dict[str, Any]:
    info = _read_json(storage.join(path, "info.json"))
    return info if isinstance(info, dict) else {}


def _read_listing(marker: Location) -> FileListing | None:
    """The files a rank's marker lists (None: no marker, or not one this code wrote)."""
    record = _read_json(marker)
    listing = record.get("files") if isinstance(record, dict) else None
    return listing if isinstance(listing, dict) else None


def _world_size(path: Location, names: Iterable[str]) -> int | None:
    """The world that saved ``path`` (info.json, else a marker's name); ``names``: the dir's."""
    world = _read_info(path).get("world_size")
    markers = sorted(int(m.group(2)) for n in names if (m := MARKER.match(n)))
    if world is None and markers:
        world = markers[0]
    return world


def incomplete_parts(path: Location) -> list[str]:
    """What keeps ``path`` from being a complete checkpoint, one phrase each (empty: complete).

    Complete: DCP's ``.metadata``, a marker per rank, and every file a marker lists present with
    its listed size. Checksums are left to loading: they read every byte. One listing of the dir
    (one request on object storage), then the small marker files.
    """
    found = storage.entries(path)
    if not found:
        return ["the directory is missing"]
    problems = [] if found.get(".metadata") is not None else [".metadata is missing"]
    world = _world_size(path, found)
    if world is None:
        return [*problems, "the rank markers (.done-rank*-of-*) are missing"]
    for rank in range(world):
        name = marker_name(rank, world)
        listing = _read_listing(storage.join(path, name)) if name in found else None
        if listing is not None:
            problems += size_problems(found, listing)
        elif name in found:
            problems.append(f"{name} holds no file listing")
        else:
            problems.append(f"{name} is missing")
    return problems


def listed_files(path: Location) -> FileListing:
    """Every file the markers of a complete checkpoint list, with its size and CRC32."""
    world = _world_size(path, storage.entries(path)) or 0
    listing: FileListing = {}
    for rank in range(world):
        listing.update(_read_listing(storage.join(path, marker_name(rank, world))) or {})
    return listing


def checkpoint_step(path: Location) -> int:
    """The step a checkpoint dir holds: from its ``step-N`` name, else its info.json."""
    match = STEP_DIR.match(storage.name(path))
    step = int(match.group(1)) if match else _read_info(path).get("step")
    if step is None:
        raise CheckpointError(
            f"checkpoint {path}: no step in its name (step-NNNNNNNN) or its info.json; point "
            "checkpoint.resume_from at a checkpoint dir"
        )
    return int(step)


def list_checkpoints(run_dir: Location) -> list[CheckpointInfo]:
    """Every ``step-N`` dir of a run (complete or not), sorted by step; scratch dirs are left out."""
    root = checkpoints_dir(run_dir)
    in_run = storage.entries(run_dir)
    found = []
    for name, size in storage.entries(root).items():
        match = STEP_DIR.match(name)
        if not match or size is not None:
            continue
        path = storage.join(root, name)
        step, info = int(match.group(1)), _read_info(path)
        complete = not incomplete_parts(path)
        metrics = metrics_step_path(run_dir, step)
        found.append(
            CheckpointInfo(
                step=step,
                tokens=int(info.get("tokens", 0)),
                path=path,
                complete=complete,
                # An unreadable info.json in a complete dir: keep it rather than guess "temporary".
                permanent=bool(info.get("permanent", complete)),
                metrics_path=metrics if in_run.get(storage.name(metrics)) is not None else None,
            )
        )
    return sorted(found, key=lambda c: c.step)


def complete_checkpoints(run_dir: Location) -> list[CheckpointInfo]:
    """The complete checkpoints, oldest first; warns naming every incomplete or scratch dir."""
    for path in scratch_dirs(run_dir):
        warnings.warn(f"skipping unfinished checkpoint dir {path}", stacklevel=3)
    complete = []
    for info in list_checkpoints(run_dir):
        if info.complete:
            complete.append(info)
        else:
            why = "; ".join(incomplete_parts(info.path))
            warnings.warn(f"skipping incomplete checkpoint {info.path} ({why})", stacklevel=3)
    return complete


def latest_checkpoint(run_dir: Location) -> CheckpointInfo | None:
    """The newest complete checkpoint (checksums unverified); warns like :func:`complete_checkpoints`."""
    complete = complete_checkpoints(run_dir)
    return complete[-1] if complete else None


def _recover_interrupted_swaps(run_dir: Path) -> None:
    """Rename ``step-N.old-*`` back when a crash hit between the two renames of a re-save.

    Run by the next commit only (before it deletes scratch dirs); until then the run resumes
    from the checkpoint before, which is as exact.
    """
    for old in scratch_dirs(run_dir, "old"):
        final = old.with_name(old.name.split(".", 1)[0])
        if not final.exists() and not incomplete_parts(old):
            old.rename(final)


# -- app state pieces -----------------------------------------------------------------------------


def rng_state(rank: int) -> dict[str, Any]:
    """This rank's RNG states, keyed ``rank<r>`` so DCP keeps every rank's copy.

    Python and NumPy states are plain tuples/lists of ints (``weights_only``-loadable); the torch
    states are byte tensors.
    """
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": (version, mt, gauss),
        "numpy": (str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return {f"rank{rank}": state}


def restore_rng(states: dict[str, Any], rank: int | None = None) -> bool:
    """Restore the RNG states of ``rank`` (or of the only rank in ``states``); False if absent.

    Absent means the checkpoint came from a smaller world: this rank keeps its current states.
    """
    if rank is None:
        if len(states) > 1:
            raise ValueError(f"restore_rng needs a rank when states hold {sorted(states)}")
        state = next(iter(states.values()), None)
    else:
        state = states.get(f"rank{rank}")
    if not state:
        return False
    if "python" in state:
        version, mt, gauss = state["python"]
        random.setstate((version, tuple(mt), gauss))
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    return True


# -- keep policy ----------------------------------------------------------------------------------


class CheckpointPolicy:
    """When to save: temporary every N steps / M minutes, permanent by ``keep`` rules and steps.

    ``keep`` rules are tried in order and the first whose ``until`` is unset or >= step decides
    (Levanter's semantics), so "every 1000 until 10000, every 5000 until 40000, every 10000"
    keeps 1000..10000, 15000..40000, 50000, ... Any returned save restarts the minute clock;
    the clock starts at the first ``decide`` call.
    """

    def __init__(self, cfg: CheckpointConfig):
        self.cfg = cfg
        self._last_save: float | None = None

    def is_permanent(self, step: int) -> bool:
        if step <= 0:
            return False
        if step in self.cfg.keep_steps:
            return True
        for rule in self.cfg.keep:
            if rule.until is None or step <= rule.until:
                return step % rule.every == 0
        return False

    def decide(self, step: int, now: float, *, final: bool = False) -> Decision:
        """This rank's decision for a save after ``step`` updates (``now``: ``time.time()``)."""
        if not self.cfg.enabled:
            return "none"
        if self._last_save is None:
            self._last_save = now
        every, minutes = self.cfg.save_interval_steps, self.cfg.save_interval_minutes
        if self.is_permanent(step) or (final and self.cfg.save_final):
            kind: Decision = "permanent"
        elif (every is not None and step % every == 0) or (
            minutes is not None and now - self._last_save >= 60 * minutes
        ):
            kind = "temporary"
        else:
            return "none"
        self._last_save = now
        return kind

    def decide_all_ranks(self, step: int, now: float, *, final: bool = False) -> Decision:
        """Rank 0's decision on every rank (clocks differ and a save needs every rank).

        A collective when a process group exists and minute-based saves are on: call it on
        every rank at the same step.
        """
        decision = self.decide(step, now, final=final)
        if self.cfg.save_interval_minutes is not None and is_distributed():
            box = [decision]
            dist.broadcast_object_list(box, src=0)
            decision = box[0]
            if decision != "none":
                self._last_save = now
        return decision


# -- safe reading ---------------------------------------------------------------------------------

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


# -- the checkpointer -----------------------------------------------------------------------------


class _ListingWriter(dcp.FileSystemWriter):
    """DCP's file writer, remembering the files this rank wrote so its marker can list them.

    The names come from DCP's own write results (and ``.metadata`` from the coordinator's
    ``finish``), not from a guess at DCP's file naming.
    """

    def __init__(self, path: Path):
        super().__init__(str(path))
        self.written: list[str] = []

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        self.written += sorted({r.storage_data.relative_path for r in future.wait()})
        return future

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        self.written.append(".metadata")


@dataclass
class _PendingSave:
    step: int
    tmp: Path
    """Where the ranks write: beside ``final``, or a node-local stage when the run is remote."""
    final: Location
    tokens: int
    permanent: bool
    metrics: dict[str, Any] | None
    writer: _ListingWriter
    future: Future | None = None


class Checkpointer:
    """Saves and loads one run's checkpoints; every method is collective across ranks.

    With ``cfg.async_save`` a save returns once the state is staged in CPU memory; it is
    committed (markers, rename, cleanup) at the next :meth:`save`, :meth:`wait` or
    :meth:`close`, so the returned path exists only after one of those.

    A run dir on object storage (a URL) keeps the same rule with no rename: each rank writes its
    shards to a node-local stage, uploads the files its marker lists, then the marker, so the
    checkpoint is complete exactly when the last rank's marker lands; an upload cut short leaves
    a dir without all markers, which no listing calls complete. Loading streams the files
    straight from the store (checksums and DCP's reads alike), nothing is downloaded whole.
    """

    def __init__(
        self, run_dir: Location, cfg: CheckpointConfig, rank: int = 0, world_size: int = 1
    ):
        self.run_dir, self.cfg = storage.normalize(run_dir), cfg
        self.remote = storage.is_url(self.run_dir)
        self.rank, self.world_size = rank, world_size
        self._pending: _PendingSave | None = None
        self._save_group: Any = None
        self._stage_cleared = False
        self.last_committed: Location | None = None
        """The newest checkpoint this checkpointer committed (with async saves: not the newest saved)."""

    # -- saving ---------------------------------------------------------------------------

    def save(
        self,
        step: int,
        app_state: dict[str, Any],
        *,
        tokens: int,
        permanent: bool,
        metrics: dict[str, Any] | None = None,
    ) -> Location:
        """Write ``app_state`` as ``step-N`` and return that path; all ranks call it together."""
        group_size = dist.get_world_size() if is_distributed() else 1
        if group_size != self.world_size:
            raise RuntimeError(
                f"Checkpointer(world_size={self.world_size}) but the process group has {group_size} ranks"
            )
        self.wait()
        final = step_dir(self.run_dir, step)
        token = self._from_rank0(uuid.uuid4().hex[:8])
        tmp = self._scratch(final, token)
        tmp.mkdir(parents=True, exist_ok=True)
        writer = _ListingWriter(tmp)
        pending = _PendingSave(step, tmp, final, tokens, permanent, metrics, writer)
        if self.cfg.async_save:
            pending.future = self._async_save(app_state, writer)
            self._pending = pending
        else:
            dcp.save(app_state, storage_writer=writer, no_dist=not is_distributed())
            self._commit(pending)
        return final

    def _scratch(self, final: Location, token: str) -> Path:
        """The dir this save writes into. For a remote run, the node's stage; stages that
        killed saves left on this node go first (never this save's: its token is new)."""
        if not self.remote:
            return beside(final, "tmp", token)
        stage = storage.stage_dir(str(self.run_dir), CHECKPOINTS)
        if not self._stage_cleared:
            for old in stage.glob("step-*.tmp-*"):
                if not old.name.endswith(f"-{token}"):
                    shutil.rmtree(old, ignore_errors=True)
            self._stage_cleared = True
        return stage / f"{storage.name(final)}.tmp-{token}"

    def _async_save(self, app_state: dict[str, Any], writer: dcp.FileSystemWriter) -> Future:
        if is_distributed() and self._save_group is None:
            # The save's collectives run in a background thread while training uses the default
            # group; a group of its own keeps the two streams of collectives apart, and gloo is
            # the CPU backend async save requires (the default group may be NCCL only).
            self._save_group = dist.new_group(backend="gloo")
        result = dcp.async_save(
            app_state,
            storage_writer=writer,
            process_group=self._save_group,
            no_dist=not is_distributed(),
        )
        return getattr(result, "upload_completion", result)

    def wait(self) -> None:
        """Finish and commit an in-flight async save (no-op when none)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.future.result()
        except (Exception, CheckpointException) as e:
            raise CheckpointError(
                f"async save of step {pending.step} into {pending.tmp} failed ({_root_cause(e)})"
            ) from None
        self._commit(pending)

    def close(self) -> None:
        self.wait()

    def _commit(self, p: _PendingSave) -> None:
        written = list(p.writer.written)
        if self.rank == 0:
            replaced = _read_info(p.final)
            info = {
                "step": p.step,
                "tokens": p.tokens,
                "world_size": self.world_size,
                "time": time.time(),
                # Re-saving a step that was permanent keeps it permanent.
                "permanent": p.permanent or bool(replaced.get("permanent", False)),
            }
            (p.tmp / "info.json").write_text(json.dumps(info))
            written.append("info.json")
        listing = list_files(p.tmp, written)
        self._write_marker(p.tmp, listing)
        if self.remote:
            self._upload(p, listing)
        self._barrier()
        error = None
        if self.rank == 0:
            try:
                self._put_in_place(p)
                if p.metrics is not None and p.permanent:
                    write_metrics_step(
                        self.run_dir, p.step, {**p.metrics, "step": p.step, "tokens": p.tokens}
                    )
            except Exception as e:  # every rank must reach the broadcast below, so no raise here
                error = f"could not commit checkpoint {p.tmp} as {p.final}: {e}"
        error = self._from_rank0(error)  # doubles as the barrier after the rename / uploads
        if self.remote:
            shutil.rmtree(p.tmp, ignore_errors=True)
        if error:
            raise CheckpointError(error)
        self.last_committed = p.final
        if self.rank == 0:
            self._drop_superseded(p.final)

    def _write_marker(self, tmp: Path, listing: FileListing) -> None:
        """This rank's commit marker with its file listing, written whole (rename) or not at all."""
        marker = tmp / marker_name(self.rank, self.world_size)
        partial = tmp / f".listing-rank{self.rank}.partial"
        partial.write_text(json.dumps({"rank": self.rank, "files": listing}))
        partial.rename(marker)

    def _upload(self, p: _PendingSave, listing: FileListing) -> None:
        """Every rank puts the files it listed into ``p.final``, its marker last.

        A step saved again (a run resumed from before it) first loses the old copy, whole,
        before any rank uploads: the two never mix in one dir.
        """
        if self.rank == 0 and storage.is_dir(p.final):
            storage.remove(p.final)
        self._barrier()
        for name in [*sorted(listing), marker_name(self.rank, self.world_size)]:
            storage.put_file(p.tmp / name, storage.join(p.final, name))

    def _put_in_place(self, p: _PendingSave) -> None:
        """Rank 0, once every rank is done: check the whole checkpoint, then (locally) rename."""
        problems = incomplete_parts(p.final if self.remote else p.tmp)
        if problems:
            raise CheckpointError(f"{'; '.join(problems)} after every rank finished")
        if self.remote:
            return
        _recover_interrupted_swaps(self.run_dir)
        if not p.final.exists():
            p.tmp.rename(p.final)
            return
        # rename() cannot replace a non-empty dir: move the old one aside, never delete it first.
        old = beside(p.final, "old", p.tmp.name.rsplit("-", 1)[1])
        p.final.rename(old)
        p.tmp.rename(p.final)
        shutil.rmtree(old, ignore_errors=True)

    def _drop_superseded(self, keep: Location) -> None:
        """Delete every other temporary checkpoint and leftover scratch dir (rank 0, after commit)."""
        for info in list_checkpoints(self.run_dir):
            if info.path != keep and not info.permanent:
                storage.remove(info.path)
        for path in scratch_dirs(self.run_dir):
            storage.remove(path)

    # -- loading --------------------------------------------------------------------------

    def has_checkpoint(self) -> bool:
        """Whether the run has a complete checkpoint of its own (rank 0 looks; all ranks agree)."""
        return self._from_rank0(
            bool(complete_checkpoints(self.run_dir)) if self.rank == 0 else None
        )

    def load_latest(self, app_state: dict[str, Any]) -> CheckpointInfo | None:
        """Load the newest complete checkpoint whose files verify; None when the run has none.

        A newer one that fails verification is named in a warning and, once an older one has
        loaded, moved aside to ``step-N.corrupt-<token>`` (kept for inspection) so that every
        later listing, the step the Ray layer restarts its data at included, agrees on where the
        run resumed. With ``on_corrupt: fail``, when no older one verifies, or when the state
        does not fit: CheckpointError, and nothing on disk has changed.
        """
        candidates = self._from_rank0(
            complete_checkpoints(self.run_dir) if self.rank == 0 else None
        )
        corrupt: list[Location] = []
        for info in reversed(candidates):
            problems = self._verify(info.path)
            if not problems:
                self._load(info.path, app_state)
                self._set_aside(corrupt)
                return info
            message = f"checkpoint {info.path} is corrupt: {'; '.join(problems)}"
            if self.cfg.on_corrupt == "fail":
                raise CorruptCheckpointError(
                    f"{message}; set checkpoint.on_corrupt=fallback to resume from the one before"
                )
            log.warning("%s; falling back to the checkpoint before it", message)
            corrupt.append(info.path)
        if corrupt:
            raise CorruptCheckpointError(
                f"no checkpoint of {self.run_dir} passes its checksums (see the warnings above); "
                "move them away to start the run over"
            )
        return None

    def load(self, path: Location, app_state: dict[str, Any]) -> None:
        """Load ``path`` into ``app_state`` in place, after checking it is whole and fits.

        ``app_state["rng"]`` is replaced by what the checkpoint holds for this rank (an empty
        dict when it was saved by a smaller world); pass it to :func:`restore_rng`.
        """
        path = storage.normalize(path)
        if not storage.is_dir(path):
            raise CheckpointError(f"checkpoint {path} does not exist")
        incomplete = incomplete_parts(path)
        if incomplete:
            raise CheckpointError(
                f"checkpoint {path} is incomplete ({'; '.join(incomplete)}): it was interrupted "
                "while saving or damaged since; resume from an earlier one"
            )
        problems = self._verify(path)
        if problems:
            raise CorruptCheckpointError(f"checkpoint {path} is corrupt: {'; '.join(problems)}")
        self._load(path, app_state)

    def _verify(self, path: Location) -> list[str]:
        """Checksum problems of a complete checkpoint; every rank reads a share of its files
        and every rank gets the whole answer (collective with a process group)."""
        listing = listed_files(path)
        share = self.world_size if is_distributed() else 1
        mine = sorted(listing)[self.rank % share :: share]
        problems = checksum_problems(path, {name: listing[name] for name in mine})
        if share > 1:
            parts: list[Any] = [None] * share
            dist.all_gather_object(parts, problems)
            problems = sorted(p for part in parts for p in part)
        return problems

    def _set_aside(self, paths: list[Location]) -> None:
        if self.rank == 0:
            for path in paths:
                storage.move(path, beside(path, "corrupt", uuid.uuid4().hex[:8]))
        self._barrier()

    def _load(self, path: Location, app_state: dict[str, Any]) -> None:
        metadata = read_metadata(path)
        resolved = {
            k: v.state_dict() if isinstance(v, Stateful) else v for k, v in app_state.items()
        }
        check_compatible(path, metadata, resolved)
        if "rng" in resolved:
            resolved["rng"] = self._rng_to_load(
                path, resolved["rng"], set(metadata.state_dict_metadata)
            )
        try:
            dcp.load(
                resolved,
                storage_reader=_safe_reader(path),
                planner=_SafeLoadPlanner(),
                no_dist=not is_distributed(),
            )
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            raise CheckpointError(
                f"checkpoint {path} could not be read ({_root_cause(e)})"
            ) from None
        for key, value in app_state.items():
            if isinstance(value, Stateful):
                value.load_state_dict(resolved[key])
        if "rng" in app_state:
            app_state["rng"] = resolved["rng"]

    def _rng_to_load(self, path: Location, rng: dict[str, Any], saved: set[str]) -> dict[str, Any]:
        kept = _prune_to_saved(rng, "rng", saved) or {}
        dropped = sorted(set(rng) - set(kept))
        if dropped:
            log.warning(
                "checkpoint %s has no RNG state for %s (saved by a smaller world or without RNG); "
                "that rank keeps its current RNG state",
                path,
                ", ".join(dropped),
            )
        return kept

    # -- collectives ----------------------------------------------------------------------

    def _from_rank0(self, value: Any) -> Any:
        if self.world_size > 1 and is_distributed():
            box = [value]
            dist.broadcast_object_list(box, src=0)
            return box[0]
        return value

    def _barrier(self) -> None:
        if self.world_size > 1 and is_distributed():
            dist.barrier()


__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CorruptCheckpointError",
    "CheckpointPolicy",
    "Checkpointer",
    "check_compatible",
    "complete_checkpoints",
    "incomplete_parts",
    "latest_checkpoint",
    "list_checkpoints",
    "listed_files",
    "marker_name",
    "read_metadata",
    "restore_rng",
    "rng_state",
]
