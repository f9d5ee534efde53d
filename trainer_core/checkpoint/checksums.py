"""File listings with sizes and CRC32s: what a checkpoint's commit markers record and loading checks.

CRC32 (stdlib ``zlib``) because it catches what happens to files at rest (flipped bits, blocks
overwritten or zeroed, truncation) and reads at several GB/s from the page cache, so verifying a
checkpoint costs about as much as loading it (``benchmarks/checkpoint.py``). It does not guard
against deliberate tampering; nothing loaded here is trusted to be code either way.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from trainer_core.io import storage
from trainer_core.io.storage import Location

CHUNK_BYTES = 8 << 20

FileListing = dict[str, dict[str, int]]
"""``{relative name: {"size": bytes, "crc32": checksum}}``"""


def crc32_of(path: Location) -> int:
    """CRC32 of a whole file, read in chunks into one reused buffer (zlib releases the GIL);
    a remote file is streamed, never stored."""
    crc = 0
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    with storage.open_file(path) if storage.is_url(path) else open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            crc = zlib.crc32(view[:n], crc)
    return crc


def list_files(root: Path, names: list[str]) -> FileListing:
    """Size and CRC32 of each of ``names`` under ``root``."""
    return {
        name: {"size": (root / name).stat().st_size, "crc32": crc32_of(root / name)}
        for name in sorted(names)
    }


def size_problems(found: dict[str, int | None], listing: FileListing) -> list[str]:
    """Listed files that are absent or of another size in ``found`` (a dir's
    :func:`trainer_core.io.storage.entries`): a cheap check, one listing for the whole dir."""
    problems = []
    for name, entry in sorted(listing.items()):
        size = found.get(name)
        if size is None:
            problems.append(f"{name} is missing")
        elif size != entry["size"]:
            problems.append(f"{name} is {size} bytes, listed as {entry['size']}")
    return problems


def checksum_problems(root: Location, listing: FileListing) -> list[str]:
    """Listed files whose content no longer has the listed CRC32 (reads every byte)."""
    problems = []
    for name, entry in sorted(listing.items()):
        found = crc32_of(storage.join(root, name))
        if found != entry["crc32"]:
            problems.append(
                f"{name} has CRC32 {found:08x}, listed as {entry['crc32']:08x} "
                "(changed after it was written)"
            )
    return problems
