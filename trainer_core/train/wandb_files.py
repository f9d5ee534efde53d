"""W&B's offline ``.wandb`` files read back: which history steps a run's segments really hold.

W&B's service writes a segment's file in 32 KiB blocks, seconds apart, so a killed process
leaves the rows it had not yet written out of it, whatever it was handed. A resumed run logs
again past the last step its files hold (:class:`~trainer_core.train.tracking.WandbCallback`),
not past the last step it handed over. The file is a LevelDB-style record log (W&B's header,
then blocks of records cut into full/first/middle/last pieces) of ``wandb_internal_pb2.Record``
messages; what this module cannot read, it says it cannot (None), and the caller keeps its own
count.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

HEADER = 7
"""":W&B", a 2-byte magic number and a 1-byte version."""
BLOCK = 32768
PIECE = 7
"""A piece's header: CRC32 (4 bytes), length (2), type (1: full, 2: first, 3: middle, 4: last)."""
SEGMENTS = "offline-run-*"
"""An offline segment's dir under ``<run_dir>/wandb``: one per start of the run."""


def records(data: bytes) -> list[bytes]:
    """The whole records of a ``.wandb`` file's bytes (a record cut by a kill is left out)."""
    if data[:4] != b":W&B":
        raise ValueError("not a W&B record log (no ':W&B' header)")
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
        if len(piece) < length:
            break  # cut mid-write
        pos += PIECE + length
        pending = piece if kind in (1, 2) else pending + piece
        if kind in (1, 4):
            out.append(pending)
    return out


def history(data: bytes) -> Iterator[tuple[str, dict]]:
    """(run id, row) for every history row of one segment's ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    run_id = ""
    for raw in records(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            yield (
                run_id,
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                },
            )


def last_step_written(files: list[bytes], run_id: str) -> int | None:
    """The last history step of W&B run ``run_id`` that its segments' files hold (0: none);
    None when a file can't be read (another format): the caller then keeps its own count."""
    try:
        steps = [
            int(row["_step"])
            for data in files
            for i, row in history(data)
            if i == run_id and "_step" in row
        ]
    except Exception:  # noqa: BLE001 (any parse failure: a format this reader doesn't know)
        return None
    return max(steps, default=0)
