"""Listing a run's checkpoints from their files alone (no torch): which are complete, their
steps, the files each commit marker lists.

A checkpoint is complete iff it has DCP's ``.metadata`` and all W rank markers
``.done-rank{r}-of-{W}``; anything else is a half-written dir that :func:`latest_checkpoint` skips.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer_core.checkpoint.checksums import (
    FileListing,
    size_problems,
)
from trainer_core.errors import RunWarning, UserError
from trainer_core.io import storage
from trainer_core.io.run_dir import (
    CHECKPOINTS,
    STEP_DIR,
    checkpoints_dir,
    metrics_step_path,
    scratch_dirs,
)
from trainer_core.io.storage import Location

if TYPE_CHECKING:
    from trainer_core.config.sections import CheckpointConfig

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


def branch_step(path: Location) -> int:
    """The step of ``checkpoint.resume_from``'s checkpoint, once ``path`` is checked to be one
    (a ``step-N`` dir, or a dir holding a checkpoint's files): a run dir or its ``checkpoints/``
    given instead is named as such, with the checkpoint to point at."""
    here = storage.entries(path)
    if not here:
        what = "is a file" if storage.is_file(path) else "does not exist (or is empty)"
        raise CheckpointError(
            f"checkpoint.resume_from: {path} {what}; point it at a checkpoint dir, "
            "<run dir>/checkpoints/step-NNNNNNNN"
        )
    match = STEP_DIR.match(storage.name(path))
    if match:
        return int(match.group(1))
    step = _read_info(path).get("step") if "info.json" in here else None
    if step is not None:
        return int(step)
    run_dir = storage.parent(path) if storage.name(path) == CHECKPOINTS else path
    found = [c.path for c in complete_checkpoints(run_dir, warn=False)]
    hint = f"; its newest complete one is {found[-1]}" if found else ""
    raise CheckpointError(
        f"checkpoint.resume_from: {path} is not a checkpoint dir (no step-NNNNNNNN name, no "
        f"info.json); point it at one, <run dir>/checkpoints/step-NNNNNNNN{hint}"
    )


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


def complete_checkpoints(run_dir: Location, warn: bool = True) -> list[CheckpointInfo]:
    """The complete checkpoints, oldest first; with ``warn``, a warning naming every incomplete
    or scratch dir (for a run about to resume; not for a message about where it would)."""
    if warn:
        for path in scratch_dirs(run_dir):
            warnings.warn(f"skipping unfinished checkpoint dir {path}", RunWarning, stacklevel=3)
    complete = []
    for info in list_checkpoints(run_dir):
        if info.complete:
            complete.append(info)
        elif warn:
            why = "; ".join(incomplete_parts(info.path))
            warnings.warn(
                f"skipping incomplete checkpoint {info.path} ({why})", RunWarning, stacklevel=3
            )
    return complete


def latest_checkpoint(run_dir: Location) -> CheckpointInfo | None:
    """The newest complete checkpoint (checksums unverified); warns like :func:`complete_checkpoints`."""
    complete = complete_checkpoints(run_dir)
    return complete[-1] if complete else None


def interruption_line(step: int, run_dir: Location, checkpoint: CheckpointConfig) -> str:
    """The one line an interrupted run ends with, with Ray or without: where it stopped and what
    re-running the same command does, which restarts from what the trainer's ``restore`` would
    load. The checkpoints are listed without the warning a scratch dir gets, which would follow
    this line."""
    where = f"interrupted at step {step}"
    if not checkpoint.enabled:
        return f"{where}; checkpoints are off (checkpoint.enabled=false): re-running starts over"
    complete = complete_checkpoints(run_dir, warn=False)
    if complete:
        return (
            f"{where}; the latest checkpoint is step {complete[-1].step}: re-run the same command "
            "to resume"
        )
    if checkpoint.resume_from:
        return (
            f"{where}; no checkpoint of its own yet: re-running starts again from "
            f"{checkpoint.resume_from}"
        )
    return f"{where}; no checkpoint yet: re-running starts over"
