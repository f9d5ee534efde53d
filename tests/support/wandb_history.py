"""The history rows of W&B's offline ``.wandb`` files, read back as W&B's sync would send them.

A ``.wandb`` file is a LevelDB-style record log (W&B's own header, then 32 KiB blocks of records
cut into full/first/middle/last pieces) of ``wandb_internal_pb2.Record`` messages.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HEADER = 7
"""":W&B", a 2-byte magic number and a 1-byte version."""
BLOCK = 32768
PIECE = 7
"""A piece's header: CRC32 (4 bytes), length (2), type (1: full, 2: first, 3: middle, 4: last)."""


def records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    out, pending, pos = [], b"", HEADER
    while pos + PIECE <= len(data):
        left = BLOCK - pos % BLOCK
        if left < PIECE:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + PIECE])
        if kind == 0:
            pos += left  # the block's zero padding
            continue
        piece = data[pos + PIECE : pos + PIECE + length]
        pos += PIECE + length
        pending = piece if kind in (1, 2) else pending + piece
        if kind in (1, 4):
            out.append(pending)
    return out


def history(run_dir: Path) -> list[tuple[str, str, dict]]:
    """(segment, run id, row) for every history row of every offline segment, oldest first."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for segment in sorted((run_dir / "wandb").glob("offline-run-*")):
        run_id = ""
        for raw in records(next(segment.glob("*.wandb"))):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
            elif kind == "history":
                row = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
                rows.append((segment.name, run_id, row))
    return rows
