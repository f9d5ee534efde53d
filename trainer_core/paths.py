"""Output dirs: checked before any work, and replaced only when the new content is complete.

Every entry point checks its output dirs first, so a dir that can never be written (under a
regular file, or without write permission) is one line naming the setting, not a
``NotADirectoryError`` after minutes of tokenizing or a Ray start-up. :func:`staged_dir` is how
a command that rebuilds a whole dir (``datasets/tokenize_corpus.py --out``) keeps the old one intact
until the new one is finished.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainer_core.configio import ConfigError


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists (a dangling link counts)."""
    return next(p for p in (path, *path.parents) if os.path.lexists(p))


def _can_write_in(directory: Path) -> bool:
    """A real write (a temp file, gone at once): permission bits say nothing for root, and
    nothing about read-only mounts or pseudo file systems such as /proc."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def check_output_dir(path: str | Path, key: str) -> Path:
    """``path`` as an absolute Path if it is, or can be made, a dir this process can write.

    Leaves nothing behind. ``key`` is the setting that chose the dir (``trainer.run_dir``, ``--out``)
    and leads the error message, so the user knows what to change.
    """
    target = Path(path).expanduser().absolute()
    found = _nearest_existing(target)
    fix = f"choose another {key}"
    if not found.is_dir():
        if found == target:
            raise ConfigError(f"{key}: {target} is a file, not a directory; {fix}")
        raise ConfigError(f"{key}: {target} can't be created, {found} is a file; {fix}")
    if not _can_write_in(found):
        if found == target:
            raise ConfigError(f"{key}: {target} is not writable; {fix}")
        raise ConfigError(f"{key}: {target} can't be created, {found} is not writable; {fix}")
    return target


@contextmanager
def staged_dir(final: str | Path) -> Iterator[Path]:
    """A new empty dir to build ``final``'s replacement in; it becomes ``final`` on success.

    The stage sits on ``final``'s file system (beside it, or in its nearest existing ancestor),
    so the swap is a rename. On any exception the stage is deleted and ``final`` is exactly as it
    was; on success the old ``final`` is gone whole, so nothing of it mixes with the new content.
    """
    final = Path(final).expanduser().resolve()
    token = f"{os.getpid()}-{secrets.token_hex(3)}"
    stage = _nearest_existing(final.parent) / f".{final.name}.staging-{token}"
    stage.mkdir()
    try:
        yield stage
        final.parent.mkdir(parents=True, exist_ok=True)
        _swap_in(stage, final, final.with_name(f".{final.name}.old-{token}"))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _swap_in(stage: Path, final: Path, old: Path) -> None:
    """Rename ``stage`` to ``final``, moving an existing ``final`` aside first and deleting it
    after. Only a kill between the two renames leaves ``final`` missing; its content is then
    whole under ``old``."""
    if not os.path.lexists(final):
        os.rename(stage, final)
        return
    os.rename(final, old)
    try:
        os.rename(stage, final)
    except OSError:
        os.rename(old, final)
        raise
    shutil.rmtree(old)
