"""Checking what ``ray job submit --working-dir`` would upload before Ray refuses it.

``ray job submit`` sends the working dir's package to the dashboard's HTTP server, which takes
at most 100 MiB a request (Ray 2.60's ``DASHBOARD_CLIENT_MAX_SIZE``, fixed), and the dashboard
stores it in the GCS, capped at the gRPC message limit (512 MiB, ``RAY_max_grpc_message_size``
overrides): Ray answers "413 ... Maximum request body size exceeded" past the first.
We walk the dir the way Ray does (skipping what ``.rayignore`` / ``.gitignore`` exclude) and
stop early with the biggest offenders named.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

DASHBOARD_REQUEST_LIMIT = 100 * 2**20
GCS_PACKAGE_LIMIT = int(os.environ.get("RAY_max_grpc_message_size", 512 * 2**20))  # noqa: SIM112 (Ray's name)
RAY_UPLOAD_LIMIT = min(DASHBOARD_REQUEST_LIMIT, GCS_PACKAGE_LIMIT)
"""The smaller of the two caps; counted here on the files before compression, so the check
errs on the safe side."""


class UploadTooLargeError(ValueError):
    pass


def ignore_patterns(root: Path) -> list[str]:
    patterns = [".git"]
    for name in (".rayignore", ".gitignore"):
        path = root / name
        if path.exists():
            for line in path.read_text().splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    patterns.append(line.strip("/"))
    return patterns


def is_ignored(rel: str, patterns: list[str]) -> bool:
    """Whether the upload leaves out ``rel`` (a path relative to the working dir, with ``/``)
    by one of ``patterns`` (:func:`ignore_patterns`), as Ray matches them."""
    parts = rel.split("/")
    return any(
        fnmatch.fnmatch(rel, p) or any(fnmatch.fnmatch(part, p) for part in parts) for p in patterns
    )


def upload_size(root: Path) -> tuple[int, dict[str, int]]:
    """Total bytes Ray would upload, and bytes per top-level entry."""
    patterns = ignore_patterns(root)
    per_top: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = [
            d for d in dirnames if not is_ignored(f"{rel_dir}/{d}".lstrip("/"), patterns)
        ]
        for f in filenames:
            rel = f"{rel_dir}/{f}".lstrip("/")
            if is_ignored(rel, patterns):
                continue
            top = rel.split("/")[0]
            per_top[top] = per_top.get(top, 0) + (Path(dirpath) / f).stat().st_size
    return sum(per_top.values()), per_top


def check_upload(root: Path, limit: int = RAY_UPLOAD_LIMIT) -> int:
    total, per_top = upload_size(root)
    if total > limit:
        biggest = sorted(per_top.items(), key=lambda kv: -kv[1])[:3]
        names = ", ".join(f"{k} ({v / 2**20:.0f} MiB)" for k, v in biggest)
        raise UploadTooLargeError(
            f"working dir {root} would upload {total / 2**20:.0f} MiB, over Ray's "
            f"{limit / 2**20:.0f} MiB limit; biggest: {names}. Add them to .rayignore (data and "
            "run outputs belong on shared storage, not in the upload)"
        )
    return total
