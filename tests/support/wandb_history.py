"""The history rows of a run dir's W&B offline segments, read back as W&B's sync would send them
(with the library's reader of the ``.wandb`` record log, :mod:`trainer_core.train.wandb_files`)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from trainer_core.train import wandb_files


def history(run_dir: Path) -> list[tuple[str, str, dict]]:
    """(segment, run id, row) for every history row of every offline segment, oldest first."""
    return [
        (segment.name, run_id, row)
        for segment in sorted((run_dir / "wandb").glob(wandb_files.SEGMENTS))
        for run_id, row in wandb_files.history(next(segment.glob("*.wandb")).read_bytes())
    ]


def cut_after(run_dir: Path, last_step: int) -> None:
    """Rewrite each offline segment's file as W&B's service leaves it when killed having written
    the rows up to ``last_step`` only (its other records kept). CRCs are zero: no reader here
    checks them."""
    from wandb.proto import wandb_internal_pb2

    for path in (run_dir / "wandb").glob(f"{wandb_files.SEGMENTS}/*.wandb"):
        data = path.read_bytes()
        kept = []
        for raw in wandb_files.records(data):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "history":
                row = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
                if "_step" in row and json.loads(row["_step"]) > last_step:
                    continue
            kept.append(raw)
        path.write_bytes(data[: wandb_files.HEADER] + _blocks(kept))


def _blocks(records: list[bytes]) -> bytes:
    """The record log's body: records cut into full/first/middle/last pieces within blocks."""
    out = bytearray()
    pos = wandb_files.HEADER
    for raw in records:
        first = True
        while True:
            left = wandb_files.BLOCK - pos % wandb_files.BLOCK
            if left < wandb_files.PIECE:
                out += bytes(left)
                pos += left
                continue
            piece, raw = raw[: left - wandb_files.PIECE], raw[left - wandb_files.PIECE :]
            kind = (1 if not raw else 2) if first else (4 if not raw else 3)
            out += struct.pack("<IHB", 0, len(piece), kind) + piece
            pos += wandb_files.PIECE + len(piece)
            first = False
            if not raw:
                break
    return bytes(out)
