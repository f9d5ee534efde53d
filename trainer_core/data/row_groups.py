"""Reading token shards' row groups: decoded and verified (page CRCs, counts, dtype, vocab) and
cached, so random-access windows cost one decode per row group, not one per window."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer_core.data.shards import (
    RETOKENIZE,
    ShardError,
)
from trainer_core.io import storage
from trainer_core.io.storage import Location

CACHE_BYTES = 512 << 20
"""Decoded row groups kept per process; the demo corpus fits entirely."""
OPEN_FILES = 64


def first_line(e: Exception) -> str:
    """pyarrow's messages can run to several lines; a one-line error keeps the first."""
    return (str(e).splitlines() or [type(e).__name__])[0]


@dataclass(frozen=True)
class ShardLayout:
    """What a split's row groups must decode to, from its manifest."""

    dtype: np.dtype
    vocab_size: int
    row_tokens: int
    row_group_rows: int

    @property
    def group_tokens(self) -> int:
        return self.row_tokens * self.row_group_rows


def decode_group(
    file: pq.ParquetFile, path: Location, index: int, file_tokens: int, layout: ShardLayout
) -> np.ndarray:
    """Decode one row group, its pages' CRCs verified, or raise a ShardError naming the file.

    Page CRCs catch flipped bits in the data; the count, dtype and vocab checks catch what they
    cannot (a damaged footer or page header, a manifest from another tokenizer) before the model
    indexes its embedding with a bad id. One vectorised max per row group keeps that cheap.
    """
    try:
        column = file.read_row_group(index, columns=["tokens"]).column("tokens").combine_chunks()
        tokens = column.flatten().to_numpy() if pa.types.is_list(column.type) else None
    except (OSError, ValueError, KeyError, pa.ArrowException) as e:
        raise ShardError(
            f"{path}: row group {index} is corrupt ({first_line(e)}); {RETOKENIZE}"
        ) from None
    expected = min(layout.group_tokens, file_tokens - index * layout.group_tokens)
    if tokens is None or tokens.size != expected or tokens.dtype != layout.dtype:
        found = column.type if tokens is None else f"{tokens.size} {tokens.dtype} tokens"
        raise ShardError(
            f"{path}: row group {index} decodes to {found}, the manifest implies {expected} "
            f"{layout.dtype} tokens; {RETOKENIZE}"
        )
    if tokens.size and int(tokens.max()) >= layout.vocab_size:
        at = int(np.argmax(tokens >= layout.vocab_size))
        row = index * layout.row_group_rows + at // layout.row_tokens
        raise ShardError(
            f"{path}: row {row} holds token id {int(tokens[at])}, outside the manifest's vocab "
            f"size {layout.vocab_size} (corrupt shard, or a manifest from another tokenizer); "
            f"{RETOKENIZE}"
        )
    return tokens


def open_parquet(path: Location) -> pq.ParquetFile:
    """A local file memory-mapped; a remote one through its fsspec filesystem, whose reads
    fetch only the row groups asked for."""
    if storage.is_url(path):
        fs, key = storage.filesystem(path)
        # Opened by pyarrow from the filesystem (not a handle we pass), so close() releases it.
        return pq.ParquetFile(key, filesystem=fs, page_checksum_verification=True)
    return pq.ParquetFile(path, memory_map=True, page_checksum_verification=True)


class RowGroupCache:
    """Decoded parquet row groups, least recently used first out, within a byte budget."""

    def __init__(self, budget_bytes: int = CACHE_BYTES):
        self.budget = budget_bytes
        self._files: OrderedDict[Location, pq.ParquetFile] = OrderedDict()
        self._groups: OrderedDict[tuple[Location, int], np.ndarray] = OrderedDict()
        self._bytes = 0

    def group(
        self, path: Location, index: int, file_tokens: int, layout: ShardLayout
    ) -> np.ndarray:
        """Row group ``index`` of ``path`` (``file_tokens`` long), decoded and checked once."""
        key = (path, index)
        hit = self._groups.get(key)
        if hit is not None:
            self._groups.move_to_end(key)
            return hit
        tokens = decode_group(self._file(path), path, index, file_tokens, layout)
        self._groups[key] = tokens
        self._bytes += tokens.nbytes
        while self._bytes > self.budget and len(self._groups) > 1:
            self._bytes -= self._groups.popitem(last=False)[1].nbytes
        return tokens

    def _file(self, path: Location) -> pq.ParquetFile:
        handle = self._files.get(path)
        if handle is None:
            try:
                handle = open_parquet(path)
            except (OSError, ValueError, pa.ArrowException) as e:
                raise ShardError(
                    f"{path}: not a readable parquet file ({first_line(e)}); {RETOKENIZE}"
                ) from None
            self._files[path] = handle
            if len(self._files) > OPEN_FILES:
                self._files.popitem(last=False)[1].close()
        self._files.move_to_end(path)
        return handle
