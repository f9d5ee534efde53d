"""Locations that may be a local path or a URL (``s3://bucket/key``, ``gs://...``).

One small seam over fsspec so that readers take one code path for local and remote files: the
same existence, size and checksum checks run wherever the bytes live. Credentials and endpoints
come from the filesystem's usual chain (for S3: ``AWS_*`` environment variables, ``~/.aws``, an
instance role; ``AWS_ENDPOINT_URL`` for an S3-compatible server), never from our configs, so
nothing here can write a secret into a config dump or run dir.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

import fsspec
from fsspec.core import url_to_fs

from trainer_core.errors import UserError

Location = str | Path
"""A local path, or a URL with a scheme (``s3://bucket/prefix``)."""


def is_url(location: Location) -> bool:
    return "://" in str(location)


def join(base: Location, *names: str) -> Location:
    """``base / name ...`` that keeps a URL a URL (``Path`` would collapse ``s3://`` to ``s3:/``)."""
    if is_url(base):
        return "/".join([str(base).rstrip("/"), *names])
    return Path(base).joinpath(*names)


def normalize(location: Location, absolute: bool = False) -> Location:
    """A URL as given; a local path with ``~`` expanded (and ``absolute``: resolved, for
    workers whose cwd differs)."""
    if is_url(location):
        return str(location)
    path = Path(location).expanduser()
    return path.resolve() if absolute else path


def filesystem(location: Location) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem serving ``location`` and the path within it."""
    try:
        return url_to_fs(str(location))
    except ImportError as e:
        raise UserError(
            f"{location}: reading this URL needs an fsspec backend that is not installed "
            f"({e}); install it, e.g. `pip install s3fs` for s3://"
        ) from None
    except ValueError as e:
        raise UserError(f"{location}: not a usable location ({e})") from None


def is_file(location: Location) -> bool:
    fs, path = filesystem(location)
    return fs.isfile(path)


def is_dir(location: Location) -> bool:
    fs, path = filesystem(location)
    return fs.isdir(path)


def size(location: Location) -> int:
    fs, path = filesystem(location)
    return int(fs.size(path))


def open_file(location: Location, mode: str = "rb") -> IO:
    fs, path = filesystem(location)
    return fs.open(path, mode)


def read_text(location: Location) -> str:
    with open_file(location, "r") as f:
        return f.read()


def stage_records(url: str, dest: Path, payload_suffix: str = ".distcp") -> Path:
    """Copy the dir tree at ``url`` into ``dest`` for readers that walk local dirs, leaving out
    the payload: files ending ``payload_suffix`` (checkpoint tensors, the bulk of an experiment)
    become sparse files of their remote size, so size-based completeness checks still see them
    but nothing is downloaded or stored."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    for path, info in fs.find(root, detail=True).items():
        local = dest / path[len(root) :].lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        if path.endswith(payload_suffix):
            with open(local, "wb") as f:
                f.truncate(int(info["size"]))
        else:
            fs.get_file(path, str(local))
    return dest


def upload_dir(local: Path, url: str) -> None:
    """Copy every file under ``local`` to the same relative key under ``url``."""
    fs, root = filesystem(url)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        fs.put_file(str(path), f"{root.rstrip('/')}/{path.relative_to(local).as_posix()}")
