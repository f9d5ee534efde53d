"""Locations that may be a local path or a URL (``s3://bucket/key``, ``gs://...``).

One small seam over fsspec so that readers and writers take one code path for local and remote
files: the same existence, size and checksum checks run wherever the bytes live. Credentials and
endpoints come from the filesystem's usual chain (for S3: ``AWS_*`` environment variables,
``~/.aws``, an instance role; ``AWS_ENDPOINT_URL`` for an S3-compatible server), never from our
configs, so nothing here can write a secret into a config dump or run dir.

Object stores have no directories, no appends and no renames of a prefix: a "dir" is a key
prefix, a write replaces one object whole (which is what makes it atomic), and a move is a copy
then a delete. Listings are never cached: other processes (ranks on other nodes) write the same
prefixes, and a stale listing would call a finished checkpoint incomplete.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import IO

import fsspec
from fsspec.core import url_to_fs

from trainer_core.errors import UserError

Location = str | Path
"""A local path, or a URL with a scheme (``s3://bucket/prefix``)."""

STAGE_ENV = "RAYLADDER_STAGE_DIR"
"""Where a node stages files bound for object storage (default: the system temp dir)."""


def is_url(location: Location) -> bool:
    return "://" in str(location)


def join(base: Location, *names: str) -> Location:
    """``base / name ...`` that keeps a URL a URL (``Path`` would collapse ``s3://`` to ``s3:/``)."""
    if is_url(base):
        return "/".join([str(base).rstrip("/"), *names])
    return Path(base).joinpath(*names)


def name(location: Location) -> str:
    """The last component (``step-00000010`` of ``s3://b/run/checkpoints/step-00000010``)."""
    return str(location).rstrip("/").rsplit("/", 1)[-1] if is_url(location) else Path(location).name


def parent(location: Location) -> Location:
    if is_url(location):
        return str(location).rstrip("/").rsplit("/", 1)[0]
    return Path(location).parent


def sibling(location: Location, new_name: str) -> Location:
    """``new_name`` in the same dir as ``location``."""
    return join(parent(location), new_name)


def normalize(location: Location, absolute: bool = False) -> Location:
    """A URL as given (without a trailing slash); a local path with ``~`` expanded (and
    ``absolute``: resolved, for workers whose cwd differs)."""
    if is_url(location):
        return str(location).rstrip("/")
    path = Path(location).expanduser()
    return path.resolve() if absolute else path


def canonical(location: Location) -> str:
    """The one spelling of a location entering from a config or the command line, so nothing
    downstream normalises it again: a URL without its trailing slash, a local path with ``~``
    expanded and made absolute (workers run in other directories: Tune trial dirs, other nodes)."""
    return str(normalize(location, absolute=True))


def as_location(text: str) -> Location:
    """A canonical string as the functions here take it: a URL stays a string, a path is a Path."""
    return text if is_url(text) else Path(text)


CLIENT_LOGGERS = ("botocore", "aiobotocore", "s3fs", "gcsfs")
"""Cloud clients that log every credential lookup at INFO: noise in a run's output wherever a
root handler (Ray's, a notebook's) shows INFO."""


def filesystem(location: Location) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem serving ``location`` (listings uncached) and the path within it."""
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return url_to_fs(str(location), use_listings_cache=False)
    except ImportError as e:
        raise UserError(
            f"{location}: no filesystem for this URL is installed ({e}); s3:// comes with "
            "rayladder, others need their fsspec package (gs://: pip install gcsfs)"
        ) from None
    except ValueError as e:
        raise UserError(f"{location}: not a usable location ({e})") from None


def is_file(location: Location) -> bool:
    if not is_url(location):
        return Path(location).is_file()
    fs, path = filesystem(location)
    return fs.isfile(path)


def is_dir(location: Location) -> bool:
    """A local dir, or a URL prefix with at least one object under it."""
    if not is_url(location):
        return Path(location).is_dir()
    fs, path = filesystem(location)
    return fs.isdir(path)


def size(location: Location) -> int:
    if not is_url(location):
        return Path(location).stat().st_size
    fs, path = filesystem(location)
    return int(fs.size(path))


def entries(location: Location) -> dict[str, int | None]:
    """Names directly under ``location``: a file's size, or None for a dir ({} when absent).

    One listing request on object storage, instead of one request per name.
    """
    if not is_url(location):
        root = Path(location)
        if not root.is_dir():
            return {}
        return {p.name: (p.stat().st_size if p.is_file() else None) for p in root.iterdir()}
    fs, path = filesystem(location)
    try:
        found = fs.ls(path, detail=True)
    except FileNotFoundError:
        return {}
    prefix = path.rstrip("/") + "/"
    return {
        info["name"].rstrip("/")[len(prefix) :]: (
            int(info["size"]) if info["type"] == "file" else None
        )
        for info in found
        if info["name"].rstrip("/") != path.rstrip("/")
    }


def open_file(location: Location, mode: str = "rb") -> IO:
    fs, path = filesystem(location)
    return fs.open(path, mode)


def read_bytes(location: Location) -> bytes:
    """The whole file, in one request for an object (which a writer may replace meanwhile:
    a single GET sees the old object or the new, never a mix)."""
    if not is_url(location):
        return Path(location).read_bytes()
    fs, path = filesystem(location)
    return fs.cat_file(path)


def read_text(location: Location) -> str:
    """:func:`read_bytes` as UTF-8 text."""
    return read_bytes(location).decode()


def write_atomic(location: Location, content: str | bytes) -> None:
    """Replace ``location`` with ``content`` whole (text as UTF-8): a reader, or a crash, sees
    the old content or the new, never a mix. Locally through ``<name>.tmp`` and a rename; on
    object storage one upload, which replaces the object whole."""
    data = content.encode() if isinstance(content, str) else content
    if is_url(location):
        fs, path = filesystem(location)
        fs.pipe_file(path, data)
        return
    path = Path(location)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def makedirs(location: Location) -> None:
    """Create a local dir and its parents; nothing to do for a URL prefix."""
    if not is_url(location):
        Path(location).mkdir(parents=True, exist_ok=True)


def remove(location: Location) -> None:
    """Delete a file or a whole dir (prefix); nothing when it is already gone."""
    if not is_url(location):
        path = Path(location)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        return
    fs, path = filesystem(location)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)


def move(source: Location, target: Location) -> None:
    """Rename (local: atomic) or copy-then-delete (object storage) a file or dir.

    On object storage each object under ``source`` (or ``source`` itself, one object) is copied
    to the same relative key under ``target``, and only those copied are deleted, once all are:
    fsspec's recursive move also copies the prefix itself, which has no object, and fails after
    copying the rest, leaving both. Empty "dir/" markers (pyarrow's) are recreated rather than
    copied, and each key is deleted by itself: fsspec's copy and bulk delete drop a marker's
    trailing slash and miss it.
    """
    if not is_url(source):
        os.rename(source, target)
        return
    fs, src = filesystem(source)
    _, dst = filesystem(target)
    src, dst = src.rstrip("/"), dst.rstrip("/")
    keys = fs.find(src)
    if not keys:
        raise FileNotFoundError(f"{source}: nothing to move")
    for key in keys:
        if key.endswith("/"):
            fs.pipe_file(dst + key[len(src) :], b"")
        else:
            fs.copy(key, dst + key[len(src) :])
    for key in keys:
        fs.rm_file(key)


def put_file(local: Path, location: Location) -> None:
    """Copy one local file to ``location`` (a copy on the same disk when it is a local path)."""
    if not is_url(location):
        shutil.copyfile(local, location)
        return
    fs, path = filesystem(location)
    fs.put_file(str(local), path)


FileStamps = dict[str, tuple[int, int]]
"""A dir's files as :func:`upload_dir` saw them: relative path -> (size, mtime in ns)."""


def upload_dir(local: Path, url: str, sent: FileStamps | None = None) -> FileStamps:
    """Copy every file under ``local`` to the same relative key under ``url``, but those
    ``sent`` (an earlier call's return, for the same dir and URL) shows unchanged since: W&B's
    dir is uploaded at every checkpoint, and most of its files are written once."""
    fs, root = filesystem(url)
    stamps: FileStamps = {}
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        key, stat = path.relative_to(local).as_posix(), path.stat()
        stamps[key] = (stat.st_size, stat.st_mtime_ns)
        if sent is None or sent.get(key) != stamps[key]:
            fs.put_file(str(path), f"{root.rstrip('/')}/{key}")
    return stamps


def upload_cache_dir(url: str, *names: str) -> Path:
    """A node-local dir for files bound for ``url`` (written here first, then uploaded).

    Keyed by the URL, so processes of one run on one node share it and runs never mix.
    """
    key = hashlib.sha1(str(url).encode()).hexdigest()[:16]
    root = Path(os.environ.get(STAGE_ENV) or tempfile.gettempdir()) / "rayladder-stage" / key
    path = root.joinpath(*names)
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_writable(url: str) -> None:
    """Write and delete a probe object under ``url``: raises OSError (or the backend's error)
    when the bucket is missing or the credentials may not write there."""
    fs, path = filesystem(url)
    probe = f"{path.rstrip('/')}/.rayladder-probe-{uuid.uuid4().hex[:8]}"
    fs.pipe_file(probe, b"")
    fs.rm(probe)


def stage_records(url: str, dest: Path, payload_suffix: str = ".distcp") -> Path:
    """Copy the dir tree at ``url`` into ``dest`` for readers that walk local dirs, leaving out
    the payload: files ending ``payload_suffix`` (checkpoint tensors, the bulk of an experiment)
    become sparse files of their remote size, so size-based completeness checks still see them
    but nothing is downloaded or stored. Empty "dir/" marker objects (pyarrow, so Ray, writes
    them) are dirs, not files."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    for path, info in fs.find(root, detail=True).items():
        if path.endswith("/"):
            continue
        local = dest / path[len(root) :].lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        if path.endswith(payload_suffix):
            with open(local, "wb") as f:
                f.truncate(int(info["size"]))
        else:
            fs.get_file(path, str(local))
    return dest
