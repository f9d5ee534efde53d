"""Output dirs: checked before any work, and replaced only when the new content is complete.

Every entry point checks its output dirs first, so a dir that can never be written (under a
regular file, or without write permission) is one line naming the setting, not a
``NotADirectoryError`` after minutes of tokenizing or a Ray start-up. :func:`replace_when_complete` is how
a command that rebuilds a whole dir (``datasets/tokenize_corpus.py --out``) keeps the old one intact
until the new one is finished.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainer_core.config.loader import ConfigError
from trainer_core.errors import UserError
from trainer_core.io import storage
from trainer_core.io.storage import Location


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


RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray for the entrypoint of a submitted job: its runtime env, ``working_dir`` included."""


def in_uploaded_working_dir() -> bool:
    """Whether this process is a Ray job's entrypoint running in an uploaded ``--working-dir``."""
    try:
        job = json.loads(os.environ.get(RAY_JOB_CONFIG_ENV) or "{}")
    except ValueError:
        return False
    return bool((job.get("runtime_env") or {}).get("working_dir"))


def canonical_output(path: Location) -> Location:
    """``storage.canonical(path)``, except a relative local path in a Ray job run from an
    uploaded ``--working-dir``: that stays relative, so :func:`check_output_dir` refuses it
    where the dir is used (made absolute here, it would point into Ray's temporary copy of the
    working dir and pass as if the user had given it)."""
    return path if _relative_in_job(path) else storage.canonical(path)


def _relative_in_job(path: Location) -> bool:
    """A relative local path, in a Ray job run from an uploaded ``--working-dir``."""
    relative = not storage.is_url(path) and not Path(path).expanduser().is_absolute()
    return relative and in_uploaded_working_dir()


def check_output_dir(path: Location, key: str) -> Location:
    """``path`` as an absolute Path if it is, or can be made, a dir this process can write; a
    URL (``s3://bucket/prefix``) as given, once a probe object was written and deleted there.

    Leaves nothing behind. ``key`` is the setting that chose the dir (``trainer.run_dir``, ``--out``)
    and leads the error message, so the user knows what to change.
    """
    if storage.is_url(path):
        url = str(storage.normalize(path))
        try:
            storage.check_writable(url)
        except UserError as e:  # no filesystem for this scheme installed
            raise ConfigError(f"{key}: {e}") from None
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"{key}: {url} is not writable ({type(e).__name__}: {e}); check the bucket name "
                "and the credentials of this machine (AWS_* variables, ~/.aws, the instance role)"
            ) from None
        return url
    if _relative_in_job(path):
        raise ConfigError(
            f"{key}: {str(path)!r} is relative, and this Ray job runs in Ray's temporary copy of "
            "--working-dir: what it writes there is not kept (nor seen by other nodes); give an "
            "absolute path on storage every node sees, or a URL (s3://...)"
        )
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
def replace_when_complete(final: str | Path) -> Iterator[Path]:
    """A new empty dir to build ``final``'s replacement in; it becomes ``final`` on success.

    The stage sits on ``final``'s file system (beside it, or in its nearest existing ancestor),
    so the swap is a rename. On any exception the stage is deleted and ``final`` is exactly as it
    was; on success the old ``final`` is gone whole, so nothing of it mixes with the new content.
    A stage that a killed process left (SIGKILL, out of memory) is deleted by the next call.
    """
    final = Path(final).expanduser().resolve()
    parent = _nearest_existing(final.parent)
    _remove_dead_stages(parent, final.name)
    token = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    stage = parent / f".{final.name}.staging-{token}"
    stage.mkdir()
    try:
        yield stage
        final.parent.mkdir(parents=True, exist_ok=True)
        _swap_in(stage, final, final.with_name(f".{final.name}.old-{token}"))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _remove_dead_stages(parent: Path, name: str) -> None:
    """Delete the stages for ``name`` in ``parent`` that a process of this host made and that
    outlived it. Another host's stage (on a shared file system) is never touched: its process
    can't be looked up from here."""
    host = re.escape(socket.gethostname())
    made_here = re.compile(rf"\.{re.escape(name)}\.staging-{host}-(\d{{1,7}})-[0-9a-f]{{6}}")
    try:
        entries = list(parent.iterdir())
    except OSError:  # a dir this process may write in but not list: nothing to find
        return
    for entry in entries:
        match = made_here.fullmatch(entry.name)
        if match and not _alive(int(match[1])) and not entry.is_symlink() and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal sent: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and is another user's
        pass
    return True


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
