"""Checkpoint checksums: CRC32 verification throughput and what they add to a save and a load.

    python benchmarks/checkpoint.py [--size 5M] [--repeats 5] [--big-mb 512]

A model of ``--size`` with AdamW state (5M: ~60 MB on disk) is saved ``--repeats`` times through
the real checkpointer. A save's checksum part is timed on its own (the marker listing: a stat
and a CRC32 per file), so "without" is the same save minus exactly that work. Loads are timed
with verification (``Checkpointer.load``) against the verification alone. Verification is also
timed over one ``--big-mb`` file to show the streaming rate past per-file costs. All reads come
from the page cache (the files were just written): a cold read is bounded by the disk instead.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import torch

from trainer_core.checkpoint.checkpointer import Checkpointer
from trainer_core.checkpoint.checksums import checksum_problems, crc32_of, list_files
from trainer_core.checkpoint.listing import listed_files
from trainer_core.config.sections import (
    CheckpointConfig,
    ModelConfig,
    ScheduleConfig,
    TrainModuleConfig,
)
from trainer_core.model.transformer import Transformer
from trainer_core.train.schedule import build_scheduler
from trainer_core.train.train_module import TrainModule


def timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def model_state(size: str) -> TrainModule:
    """A model and AdamW with its moments filled (one step), as a checkpoint holds them."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(size=size), 128)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 256, (2, 128))).float().mean().backward()
    optimizer.step()
    scheduler = build_scheduler(optimizer, ScheduleConfig(kind="constant", warmup=0), 1)
    return TrainModule(
        model, optimizer, scheduler, TrainModuleConfig(), seq_len=128, device=torch.device("cpu")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="5M")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--big-mb", type=int, default=512)
    args = ap.parse_args()

    memory = os.urandom(256 << 20)
    rate = len(memory) / timed(zlib.crc32, memory) / 1e9
    print(f"zlib.crc32 in memory: {rate:.2f} GB/s")

    state = model_state(args.size)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Checkpointer(tmp, CheckpointConfig())
        saves, sums, verifies, loads = [], [], [], []
        for step in range(1, args.repeats + 1):
            saves.append(timed(ckpt.save, step, {"m": state}, tokens=0, permanent=True))
            path = ckpt.last_committed
            listing = listed_files(path)
            sums.append(timed(list_files, path, list(listing)))
            verifies.append(timed(checksum_problems, path, listing))
            loads.append(timed(ckpt.load, path, {"m": state}))
        size = sum(entry["size"] for entry in listing.values())
        save, checksum = statistics.median(saves), statistics.median(sums)
        verify, load = statistics.median(verifies), statistics.median(loads)
        print(
            f"checkpoint of {args.size} with AdamW state: {size / 1e6:.1f} MB in {len(listing)} files"
        )
        print(
            f"save: {save:.3f} s with checksums, {save - checksum:.3f} s without: "
            f"+{checksum:.3f} s (+{100 * checksum / (save - checksum):.1f}%)"
        )
        print(f"verify: {verify:.3f} s = {size / verify / 1e9:.2f} GB/s")
        print(
            f"load: {load:.3f} s with verification, {load - verify:.3f} s without "
            f"(+{100 * verify / (load - verify):.1f}%)"
        )

        big = Path(tmp) / "big.bin"
        with big.open("wb") as f:
            for _ in range(args.big_mb // 64):
                f.write(os.urandom(64 << 20))
        crc32_of(big)  # into the page cache
        seconds = statistics.median(timed(crc32_of, big) for _ in range(3))
        print(f"verify one {args.big_mb} MB file: {big.stat().st_size / seconds / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
