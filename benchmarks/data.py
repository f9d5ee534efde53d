"""Data-layer speed: tokenization MB/s and loader tokens/s (Ray Data reader vs local pyarrow reader).

    python benchmarks/data.py [--seq-len 512] [--batch 64] [--steps 3000] [--decode-only]

Uses the demo corpus (this Python's standard library) with the byte tokenizer. Tokenization is
timed for the Ray Data pipeline (``datasets/tokenize_corpus.py``'s) and in-process; the loaders deliver
the same batches to one consumer; the Ray reader is timed from dataset creation, once with fresh
workers (their start-up counts) and once warm. The training loop's own token consumption is measured by benchmarks/train_step.py.

The cost of checking what is read (page CRCs, token count, dtype, vocab) is timed on its own:
every row group decoded once by the reader, against a bare pyarrow decode without those checks,
in alternating rounds so that load on a shared machine hits both alike (``--decode-only``: this
part alone, no Ray, which is then never imported).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import tempfile
import time

import pyarrow.parquet as pq

from trainer_core.config.sections import DataConfig
from trainer_core.data.demo_corpus import DEMO_READ, demo_files
from trainer_core.data.row_groups import RowGroupCache
from trainer_core.data.text_sources import TEXT, InputFile, write_shards
from trainer_core.data.token_data import Split, TokenData, open_token_data
from trainer_core.data.tokenizer import ByteTokenizer


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def decode_unchecked(split: Split) -> int:
    """Every row group of ``split`` decoded as the reader did before it checked pages, ids and
    dtype: no page CRCs, the token count compared and nothing else. The groups are kept, as the
    reader's cache keeps them (freed buffers would be reused, fresh ones cost page faults)."""
    kept = []
    for path, tokens in zip(split.paths, split.tokens.tolist(), strict=True):
        file = pq.ParquetFile(path, memory_map=True)
        for index in range(file.num_row_groups):
            column = file.read_row_group(index, columns=["tokens"]).column("tokens")
            kept.append(column.combine_chunks().flatten().to_numpy())
            if kept[-1].size != min(
                split.layout.group_tokens, tokens - index * split.layout.group_tokens
            ):
                raise ValueError(f"{path}: row group {index} has {kept[-1].size} tokens")
    return sum(k.size for k in kept)


def decode_checked(split: Split) -> int:
    """Every row group of ``split`` decoded by the training reader, every check on."""
    cache, total = RowGroupCache(), 0
    for path, tokens in zip(split.paths, split.tokens.tolist(), strict=True):
        for index in range(-(-tokens // split.layout.group_tokens)):
            total += cache.group(path, index, tokens, split.layout).size
    return total


def decode_cost(split: Split, rounds: int = 15) -> None:
    """Rates by CPU time (wall time on a shared machine mostly measures the neighbours)."""
    rates: dict[str, list[float]] = {"unchecked": [], "checked": []}
    for _ in range(rounds):
        for name, decode in (("unchecked", decode_unchecked), ("checked", decode_checked)):
            start = time.process_time()
            tokens = decode(split)
            rates[name].append(tokens / (time.process_time() - start) / 1e6)
    plain, checked = (statistics.median(rates[k]) for k in ("unchecked", "checked"))
    print(f"shard decode, every row group once ({tokens / 1e6:.1f}M tokens), median of {rounds}:")
    print(f"  count check only (the reader before):          {plain:8.2f} M tokens/s CPU")
    print(f"  reader: page CRCs + count/dtype/vocab checks:  {checked:8.2f} M tokens/s CPU")
    print(f"  checked / before: {checked / plain:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=64, help="sequences per step (one consumer)")
    p.add_argument("--steps", type=int, default=3000, help="~100M tokens: past start-up")
    p.add_argument("--decode-only", action="store_true", help="only the cost of the read checks")
    args = p.parse_args()
    data = open_token_data(DataConfig(), 320)
    decode_cost(data.train[0])
    if args.decode_only:
        return

    import ray
    import ray.data

    from trainer_core.ray.reader import batches_from_shard, ray_train_dataset
    from trainer_core.ray.runtime import init_ray, submitted_or_local
    from trainer_core.ray.tokenization import tokenize_to_shards

    init_ray(submitted_or_local(), dashboard=False)
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
