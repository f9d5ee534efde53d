"""Data-layer speed: tokenization MB/s and loader tokens/s (Ray Data reader vs local pyarrow reader).

    python benchmarks/data.py [--seq-len 512] [--batch 64] [--steps 3000]

Uses the demo corpus (this Python's standard library) with the byte tokenizer. Tokenization is
timed for the Ray Data pipeline (``datasets/tokenize.py``'s) and in-process; the loaders deliver
the same batches to one consumer; the Ray reader is timed from dataset creation, once with fresh
workers (their start-up counts) and once warm. The training loop's own token consumption is measured by benchmarks/train_step.py.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import tempfile
import time

from trainer_core.config import DataConfig
from trainer_core.corpus import DEMO_READ, demo_files
from trainer_core.data import TokenData, open_token_data
from trainer_core.text_sources import TEXT, InputFile, write_shards
from trainer_core.tokenizer import ByteTokenizer


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=64, help="sequences per step (one consumer)")
    p.add_argument("--steps", type=int, default=3000, help="~100M tokens: past start-up")
    args = p.parse_args()

    import ray
    import ray.data

    from trainer_core.ray.data import batches_from_shard, ray_train_dataset, tokenize_to_shards

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", logging_config=ray.LoggingConfig(log_level="ERROR"))
    else:
        ray.init(
            address="local",
            include_dashboard=False,
            logging_config=ray.LoggingConfig(log_level="ERROR"),
        )
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ray.data.DataContext.get_current().enable_progress_bars = False
    cpus = int(ray.cluster_resources().get("CPU", 0))

    files = [InputFile(str(f), TEXT, None, f.stat().st_size) for f in demo_files()]

    def ray_pipeline(out: str):
        return tokenize_to_shards(
            files, ByteTokenizer(), out, DEMO_READ, val_fraction=0.01, shard_tokens=1 << 22
        )

    with tempfile.TemporaryDirectory() as tmp:
        (_, stats), t_ray_first = timed(lambda: ray_pipeline(f"{tmp}/ray1"))
        _, t_ray = timed(lambda: ray_pipeline(f"{tmp}/ray2"))
        _, t_local = timed(
            lambda: write_shards(
                files, ByteTokenizer(), f"{tmp}/local", DEMO_READ, shard_tokens=1 << 22
            )
        )
    mb = stats.text_bytes / 1e6
    print(
        f"tokenization, byte tokenizer, demo corpus ({len(files)} files, {mb:.1f} MB), {cpus} Ray CPUs:"
    )
    print(
        f"  Ray Data pipeline, first run: {mb / t_ray_first:8.1f} MB/s  ({t_ray_first:.1f} s, worker start-up included)"
    )
    print(f"  Ray Data pipeline, warm:      {mb / t_ray:8.1f} MB/s  ({t_ray:.1f} s)")
    print(f"  in-process (no Ray):          {mb / t_local:8.1f} MB/s  ({t_local:.1f} s)")

    data = open_token_data(DataConfig(), 320)
    seq, batch, steps = args.seq_len, args.batch, args.steps
    tokens = steps * batch * (seq + 1)

    def consume(batches) -> None:
        for _ in itertools.islice(batches, steps):
            pass

    _, t_cold = timed(lambda: consume(TokenData.open(data.spec).train_batches(seq, batch, seed=0)))
    _, t_warm = timed(lambda: consume(data.train_batches(seq, batch, seed=0)))
    _, t_warm = timed(lambda: consume(data.train_batches(seq, batch, seed=0)))

    def ray_reader() -> None:
        ds = ray_train_dataset(data.spec, seq, batch, 0, 0, steps, 0, 1)
        consume(batches_from_shard(ds, batch, expected_start_step=0))

    _, t_ray_first = timed(ray_reader)
    _, t_ray_warm = timed(ray_reader)
    rate = lambda seconds: tokens / seconds / 1e6  # noqa: E731
    print(
        f"loader, seq_len {seq}, {batch} sequences/step, {steps} steps ({tokens / 1e6:.1f}M tokens), one consumer:"
    )
    print(f"  local pyarrow reader, cold cache:              {rate(t_cold):8.2f} M tokens/s")
    print(f"  local pyarrow reader, warm cache:              {rate(t_warm):8.2f} M tokens/s")
    print(f"  Ray Data reader, first run (worker start-up):  {rate(t_ray_first):8.2f} M tokens/s")
    print(f"  Ray Data reader, warm workers:                 {rate(t_ray_warm):8.2f} M tokens/s")
    print(
        f"  ratio local / Ray Data: {t_ray_first / t_cold:.1f}x cold, {t_ray_warm / t_warm:.1f}x warm"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
