"""Saving and loading sharded checkpoints: atomic commit, integrity listings, async saves.

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

import json
import logging
import shutil
import time
import uuid
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful

from trainer_core.checkpoint.checksums import (
    FileListing,
    checksum_problems,
    list_files,
)
from trainer_core.checkpoint.listing import (
    CheckpointError,
    CheckpointInfo,
    CorruptCheckpointError,
    _read_info,
    complete_checkpoints,
    incomplete_parts,
    list_checkpoints,
    listed_files,
    marker_name,
)
from trainer_core.checkpoint.renames import RENAMED, as_saved, rename_parameters
from trainer_core.checkpoint.safe_load import (
    _prune_to_saved,
    _root_cause,
    _safe_reader,
    _SafeLoadPlanner,
    check_compatible,
    read_metadata,
)
from trainer_core.compat import dcp_async_save, dcp_call, dcp_runs_collectives
from trainer_core.config.sections import CheckpointConfig
from trainer_core.io import storage
from trainer_core.io.run_dir import (
    CHECKPOINTS,
    beside,
    scratch_dirs,
    step_dir,
    write_metrics_step,
)
from trainer_core.io.storage import Location
from trainer_core.parallel.process_group import all_gather_object, is_distributed

log = logging.getLogger(__name__)
# DCP warns on every save/load without a process group (also from async save's thread); a
# single-process run is intended here.
warnings.filterwarnings(
    "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
)


def _move_aside(paths: list[Location]) -> str | None:
    """Move each corrupt checkpoint to ``step-N.corrupt-<token>``; the first failure as text
    (for the broadcast), or None."""
    for path in paths:
        aside = beside(path, "corrupt", uuid.uuid4().hex[:8])
        try:
            storage.move(path, aside)
        except Exception as e:  # every rank must reach the broadcast, so no raise here
            return (
                f"checkpoint {path} is corrupt and could not be moved aside to {aside} ({e}); "
                "move or delete it, then re-run to resume from the checkpoint before it"
            )
    return None


def _recover_interrupted_swaps(run_dir: Path) -> None:
    """Rename ``step-N.old-*`` back when a crash hit between the two renames of a re-save.

    Run by the next commit only (before it deletes scratch dirs); until then the run resumes
    from the checkpoint before, which is as exact.
    """
    for old in scratch_dirs(run_dir, "old"):
        final = old.with_name(old.name.split(".", 1)[0])
        if not final.exists() and not incomplete_parts(old):
            old.rename(final)


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
        self.run_dir, self.cfg = run_dir, cfg
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
            dcp_call(dcp.save, app_state, storage_writer=writer)
            self._commit(pending)
        return final

    def _scratch(self, final: Location, token: str) -> Path:
        """The dir this save writes into. For a remote run, the node's stage; stages that
        killed saves left on this node go first (never this save's: its token is new)."""
        if not self.remote:
            return beside(final, "tmp", token)
        stage = storage.upload_cache_dir(str(self.run_dir), CHECKPOINTS)
        if not self._stage_cleared:
            for old in stage.glob("step-*.tmp-*"):
                if not old.name.endswith(f"-{token}"):
                    shutil.rmtree(old, ignore_errors=True)
            self._stage_cleared = True
        return stage / f"{storage.name(final)}.tmp-{token}"

    def _async_save(self, app_state: dict[str, Any], writer: dcp.FileSystemWriter) -> Future:
        if dcp_runs_collectives() and self._save_group is None:
            # The save's collectives run in a background thread while training uses the default
            # group; a group of its own keeps the two streams of collectives apart, and gloo is
            # the CPU backend async save requires (the default group may be NCCL only).
            self._save_group = dist.new_group(backend="gloo")
        result = dcp_async_save(app_state, storage_writer=writer, process_group=self._save_group)
        return getattr(result, "upload_completion", result)

    def wait(self) -> None:
        """Finish and commit an in-flight async save (no-op when none)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        error = None
        try:
            pending.future.result()
        except (Exception, CheckpointException) as e:
            error = (
                f"async save of step {pending.step} into {pending.tmp} failed ({_root_cause(e)})"
            )
        # Every rank learns of a failure on any one before the commit's collectives, which a
        # rank that raised here would leave the others waiting in.
        error = next((e for e in self._all_ranks(error) if e), None)
        if error:
            raise CheckpointError(error)
        self._commit(pending)

    def close(self) -> None:
        self.wait()

    def _commit(self, p: _PendingSave) -> None:
        written = list(p.writer.written)
        error = None
        if self.rank == 0:
            error = self._write_metrics(p)
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
        # Every rank takes the same collectives whatever fails: a rank that skipped one would
        # leave the others waiting on it until the process group's timeout.
        error = self._from_rank0(error)
        if error is None:  # without rank 0's marker the save never counts as complete
            self._write_marker(p.tmp, listing)
            if self.remote:
                error = self._upload(p, listing)
        self._barrier()
        if self.rank == 0 and error is None:
            try:
                self._put_in_place(p)
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

    def _write_metrics(self, p: _PendingSave) -> str | None:
        """A permanent save's ``metrics_step{N}.json``, written before the checkpoint can count
        as complete: written after, a kill in between resumed past it and lost the analysis an
        annealed point for good. An error comes back as text for the broadcast."""
        if p.metrics is None or not p.permanent:
            return None
        try:
            write_metrics_step(
                self.run_dir, p.step, {**p.metrics, "step": p.step, "tokens": p.tokens}
            )
        except Exception as e:
            return f"could not write the metrics of checkpoint {p.final}: {e}"
        return None

    def _write_marker(self, tmp: Path, listing: FileListing) -> None:
        """This rank's commit marker with its file listing, written whole (rename) or not at all."""
        marker = tmp / marker_name(self.rank, self.world_size)
        partial = tmp / f".listing-rank{self.rank}.partial"
        partial.write_text(json.dumps({"rank": self.rank, "files": listing}))
        partial.rename(marker)

    def _upload(self, p: _PendingSave, listing: FileListing) -> str | None:
        """Every rank puts the files it listed into ``p.final``, its marker last; the first
        rank's error as text (every rank gets the same), or None.

        A step saved again (a run resumed from before it) first loses the old copy, whole,
        before any rank uploads: the two never mix in one dir.
        """
        error = None
        if self.rank == 0 and storage.is_dir(p.final):
            try:
                storage.remove(p.final)
            except Exception as e:
                error = f"could not replace checkpoint {p.final}: {e}"
        error = self._from_rank0(error)
        if error is None:
            try:
                for name in [*sorted(listing), marker_name(self.rank, self.world_size)]:
                    storage.put_file(p.tmp / name, storage.join(p.final, name))
            except Exception as e:
                error = f"rank {self.rank} could not upload checkpoint {p.final}: {e}"
        return next((e for e in self._all_ranks(error) if e), None)

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

    def complete(self) -> list[CheckpointInfo]:
        """The run's own complete checkpoints, oldest first (rank 0 lists; all ranks agree)."""
        return self._from_rank0(complete_checkpoints(self.run_dir) if self.rank == 0 else None)

    def load_latest(
        self, app_state: dict[str, Any], candidates: list[CheckpointInfo] | None = None
    ) -> CheckpointInfo | None:
        """Load the newest complete checkpoint whose files verify; None when the run has none.

        A newer one that fails verification is named in a warning and, once an older one has
        loaded, moved aside to ``step-N.corrupt-<token>`` (kept for inspection) so that every
        later listing, the step the Ray layer restarts its data at included, agrees on where the
        run resumed. With ``on_corrupt: fail``, when no older one verifies, or when the state
        does not fit: CheckpointError, and nothing on disk has changed. ``candidates``: what
        :meth:`complete` returned, when the caller listed them already.
        """
        if candidates is None:
            candidates = self.complete()
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
        """Rank 0 moves the corrupt ``paths`` aside; a failure stops every rank alike.

        Not a warning, though an older checkpoint has loaded: left in place, the corrupt one
        stays the latest in every listing, and under Ray Train the data would start at its step
        again after each restart (:func:`trainer_core.ray.reader.resume_step`).
        """
        error = _move_aside(paths) if self.rank == 0 else None
        error = self._from_rank0(error)  # doubles as the barrier after the moves
        if error:
            raise CheckpointError(error)

    def _load(self, path: Location, app_state: dict[str, Any]) -> None:
        metadata = read_metadata(path)
        resolved = {
            k: v.state_dict() if isinstance(v, Stateful) else v for k, v in app_state.items()
        }
        resolved, renamed = as_saved(resolved, set(metadata.state_dict_metadata))
        check_compatible(path, metadata, resolved)
        if "rng" in resolved:
            resolved["rng"] = self._rng_to_load(
                path, resolved["rng"], set(metadata.state_dict_metadata)
            )
        try:
            dcp_call(
                dcp.load, resolved, storage_reader=_safe_reader(path), planner=_SafeLoadPlanner()
            )
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            raise CheckpointError(
                f"checkpoint {path} could not be read ({_root_cause(e)})"
            ) from None
        if renamed:
            resolved = rename_parameters(resolved, RENAMED)
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

    def _all_ranks(self, value: Any) -> list[Any]:
        if self.world_size > 1 and is_distributed():
            return all_gather_object(value)
        return [value]

    def _barrier(self) -> None:
        if self.world_size > 1 and is_distributed():
            dist.barrier()
