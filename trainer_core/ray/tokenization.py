"""Ray Data's parallel tokenization: text files in, token shards out, the same bytes as one process.

One ``map_batches`` call per group of input files (read, decode, tokenize, hash for the split) in
parallel; the driver takes the documents in input order and writes the shards, so the output is
identical however many workers ran.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import ray
import ray.data

from trainer_core.data.shards import DataError, Manifest, token_dtype
from trainer_core.data.text_sources import (
    InputFile,
    ReadOptions,
    ReadStats,
    finish_shards,
    new_writer,
    tokenize_file,
)

GROUP_BYTES = 64 << 20
"""Input bytes per tokenization task at most (more tasks than TASKS_PER_CPU x CPUs only then)."""
TASKS_PER_CPU = 4
GROUP_FILE_OVERHEAD = 4096
"""Each file counts as this many extra bytes when grouping (opening a file has a cost too)."""


def _doc_table(tokens: list[np.ndarray], keys: list[float], dtype: np.dtype) -> pa.Table:
    lengths = np.array([t.size for t in tokens], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.concatenate(tokens).astype(dtype) if tokens else np.empty(0, dtype)
    column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    return pa.table(
        {"tokens": column, "key": pa.array(keys, pa.float64()), "stats": pa.array([""] * len(keys))}
    )


def _stats_table(stats: dict, dtype: np.dtype) -> pa.Table:
    empty = pa.LargeListArray.from_arrays(
        pa.array([0, 0], pa.int64()), pa.array([], pa.from_numpy_dtype(dtype))
    )
    return pa.table(
        {"tokens": empty, "key": pa.array([0.0]), "stats": pa.array([json.dumps(stats)])}
    )


def file_groups(files: list[InputFile], num_groups: int) -> list[tuple[int, int]]:
    """Split ``files`` into at most ``num_groups`` runs ``[first, last)`` of about equal bytes.

    One task per group: a task per small file would cost more in scheduling than in work.
    """
    weights = np.array([f.size + GROUP_FILE_OVERHEAD for f in files], dtype=np.int64)
    before = np.cumsum(weights) - weights
    group = before * num_groups // int(weights.sum())
    cuts = [0, *(np.flatnonzero(np.diff(group)) + 1).tolist(), len(files)]
    return list(itertools.pairwise(cuts))


def _tokenize_files(
    batch: dict[str, np.ndarray], files: list[InputFile], tokenizer, opts: ReadOptions
):
    """Ray task body: every document of each file in the group, then one stats row per file.

    A DataError travels as a row too, so the driver raises the first one in input order with
    its own message (not a remote traceback), whichever task hit it first.
    """
    dtype = token_dtype(tokenizer.vocab_size)
    for index in range(int(batch["first"][0]), int(batch["last"][0])):
        stats = ReadStats()
        try:
            for docs in tokenize_file(files[int(index)], tokenizer, opts, stats):
                yield _doc_table(docs.tokens, docs.keys, dtype)
        except DataError as e:
            yield _stats_table({"error": str(e)}, dtype)
            return
        yield _stats_table(stats.to_dict(), dtype)


def tokenize_to_shards(
    files: list[InputFile],
    tokenizer,
    out_dir: str | Path,
    opts: ReadOptions,
    *,
    val_fraction: float,
    shard_tokens: int,
    on_file: Callable[[ReadStats], None] | None = None,
    info: dict | None = None,
) -> tuple[Manifest, ReadStats]:
    """Tokenize ``files`` with Ray Data into ``out_dir``: the same bytes as ``text_sources.write_shards``.

    ``on_file`` is called with each file's counts as it completes (in input order), for progress.
    A DataError about any file (bad JSON, undecodable text, ...) is raised here, on the driver.
    """
    totals = ReadStats()
    writer = new_writer(out_dir, tokenizer, val_fraction, shard_tokens)
    cpus = max(int(ray.cluster_resources().get("CPU", 1)), 1)
    total = sum(f.size for f in files)
    groups = file_groups(
        files, min(len(files), max(TASKS_PER_CPU * cpus, -(-total // GROUP_BYTES)))
    )
    items = [{"first": a, "last": b} for a, b in groups]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(
        _tokenize_files,
        batch_size=1,
        batch_format="numpy",
        fn_kwargs=dict(files=files, tokenizer=tokenizer, opts=opts),
    )
    ds.context.execution_options.preserve_order = True
    file_index = 0
    for table in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        column = table.column("tokens").combine_chunks()
        values, offsets = column.values.to_numpy(), column.offsets.to_numpy()
        rows = zip(table.column("key").to_pylist(), table.column("stats").to_pylist(), strict=True)
        for i, (key, stats) in enumerate(rows):
            if not stats:
                writer.add(values[offsets[i] : offsets[i + 1]], key, files[file_index].path)
                continue
            counts = json.loads(stats)
            if "error" in counts:
                raise DataError(counts["error"])
            done = ReadStats(**counts)
            totals.add(done)
            file_index += 1
            if on_file:
                on_file(done)
    return finish_shards(writer, totals, len(files), info), totals
