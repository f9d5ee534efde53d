"""Raw text inputs for tokenization: finding files, reading each kind, the UTF-8 policy.

Kinds, by name (after a ``.gz`` / ``.zst`` suffix is set aside):

* ``.jsonl`` / ``.json`` / ``.ndjson``: one JSON object per line, the text in a field;
* ``.parquet``: the text in a column (string, or binary decoded as UTF-8);
* anything else: the whole file is one document.

Paths can be local files, directories (searched recursively, hidden entries skipped), globs, or
fsspec URLs (``s3://``, ``gs://``, ...; needs the matching fsspec backend). Everything here is
plain Python so tests and the in-process demo use it directly; the Ray Data pipeline in
:mod:`trainer_core.ray.tokenization` runs :func:`tokenize_file` once per file in parallel.
fsspec (0.1 s to import, in every tokenizing process) is imported only for URL inputs.
"""

from __future__ import annotations

import codecs
import functools
import glob
import gzip
import io
import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from trainer_core.data.shards import (
    DEFAULT_SHARD_TOKENS,
    DEFAULT_VAL_FRACTION,
    DataError,
    DatasetWriter,
    Manifest,
    TokenizerInfo,
    check_ids,
    is_shard_dir,
    split_key,
)
from trainer_core.data.tokenizer import RUN_START

TEXT, JSONL, PARQUET = "text", "jsonl", "parquet"
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSONL_SUFFIXES = {".jsonl", ".json", ".ndjson"}
DecodePolicy = Literal["strict", "replace", "skip"]
DECODE_POLICIES = ("strict", "replace", "skip")
GLOB_CHARS = set("*?[")
DOCS_PER_BATCH = 256
BATCH_CHARS = 1 << 20
"""Text per tokenizer call, as well as documents: BPE encoding takes ~160 bytes per byte."""


@dataclass(frozen=True)
class InputFile:
    path: str
    """A local absolute path or a URL."""
    kind: str
    compression: str | None
    size: int = 0
    """Bytes on disk (0 = unknown): only used to share work evenly between tasks."""


@dataclass(frozen=True)
class ReadOptions:
    text_field: str = "text"
    parquet_column: str = "text"
    on_decode_error: DecodePolicy = "strict"

    def __post_init__(self) -> None:
        if self.on_decode_error not in DECODE_POLICIES:
            raise DataError(
                f"--on-decode-error {self.on_decode_error!r}: use one of {', '.join(DECODE_POLICIES)}"
            )


@dataclass
class ReadStats:
    """Counts for the summary; summed over files with :meth:`add`."""

    files: int = 0
    documents: int = 0
    text_bytes: int = 0
    empty_documents: int = 0
    replaced_documents: int = 0
    skipped_documents: int = 0
    skipped_files: int = 0

    def add(self, other: ReadStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict:
        return asdict(self)


def classify(path: str, size: int = 0) -> InputFile:
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    stem, suffix = os.path.splitext(name)
    compression = COMPRESSIONS.get(suffix)
    if compression:
        suffix = os.path.splitext(stem)[1]
    kind = JSONL if suffix in JSONL_SUFFIXES else PARQUET if suffix == ".parquet" else TEXT
    return InputFile(path, kind, compression, size)


def _is_url(pattern: str) -> bool:
    return "://" in pattern and not pattern.startswith("file://")


def _visible(path: str) -> bool:
    return not any(part.startswith(".") for part in Path(path).parts[1:])


def _size(path: str) -> int:
    """Bytes of ``path``; a broken link or an entry that can't be read is one line naming it."""
    try:
        return os.path.getsize(path)
    except OSError as e:
        why = f"a broken link to {os.readlink(path)}" if os.path.islink(path) else e.strerror
        raise DataError(f"{path}: can't read it ({why}); remove it or fix it") from None


def _local_path(pattern: str) -> str:
    return os.path.expanduser(pattern.removeprefix("file://"))


def _expand_local(pattern: str) -> tuple[list[tuple[str, int]], list[str]]:
    """The files ``pattern`` names, with their sizes, and the shard dirs it reached, left out."""
    pattern = _local_path(pattern)
    globbed = bool(GLOB_CHARS & set(pattern))
    matches = sorted(glob.glob(pattern, recursive=True)) if globbed else [pattern]
    shard_dir = functools.cache(is_shard_dir)
    found: list[str] = []
    left_out: dict[str, None] = {}
    for m in matches:
        parent = os.path.dirname(os.path.abspath(m))  # a glob's match in a shard dir: left out
        if os.path.isdir(m):
            for root, dirs, names in os.walk(m):
                if shard_dir(root):
                    left_out[os.path.abspath(root)] = None
                    dirs.clear()
                    continue
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
        elif globbed and shard_dir(parent):
            left_out[parent] = None
        elif os.path.isfile(m) or os.path.islink(m):  # a broken link too: _size names it
            found.append(m)
    return [(os.path.abspath(p), _size(p)) for p in found], list(left_out)


def _expand_url(pattern: str) -> list[tuple[str, int]]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(pattern)
    found: dict[str, dict] = {}
    for m in sorted(fs.glob(path)):
        found.update(sorted(fs.find(m, detail=True).items()) if fs.isdir(m) else [(m, fs.info(m))])
    return [
        (fs.unstrip_protocol(p), int(info.get("size") or 0))
        for p, info in found.items()
        if _visible(p)
    ]


def discover_inputs(
    patterns: list[str], on_shard_dir: Callable[[str], None] = lambda directory: None
) -> list[InputFile]:
    """Every input file, in a deterministic order (patterns in order, each sorted), no repeats.

    A local dir that holds shards (a ``--out`` of an earlier run inside an input dir) is left
    out, and passed to ``on_shard_dir``: its files are tokens, not text.
    """
    if not patterns:
        raise DataError(
            "no --input given; pass files, directories or quoted globs like 'corpus/*.jsonl'"
        )
    seen: dict[str, int] = {}
    for pattern in patterns:
        paths, left_out = (_expand_url(pattern), []) if _is_url(pattern) else _expand_local(pattern)
        for directory in left_out:
            on_shard_dir(directory)
        if not paths and left_out:
            raise DataError(
                f"--input {pattern!r} holds only shard dirs ({', '.join(left_out)}), the output of "
                "tokenizing, not text; pass the text files"
            )
        if not paths and not _is_url(pattern) and os.path.isdir(_local_path(pattern)):
            raise DataError(
                f"--input {pattern!r} is an empty directory (no visible files; names starting "
                "with '.' are skipped); put the text files in it or pass the dir that holds them"
            )
        if not paths:
            raise DataError(
                f"no input matched {pattern!r}; check the path (and quote globs so the shell leaves them alone)"
            )
        seen.update(paths)
    return [classify(p, size) for p, size in seen.items()]


def decode(data: bytes, policy: DecodePolicy, where: str, stats: ReadStats) -> str | None:
    """UTF-8 text, or under ``replace`` with U+FFFD for bad bytes, or ``None`` (skip) under ``skip``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if policy == "strict":
            raise DataError(
                f"{where}: not valid UTF-8 (byte {e.start}: {e.reason}); fix the encoding or pass "
                "--on-decode-error replace (or skip)"
            ) from None
        if policy == "replace":
            stats.replaced_documents += 1
            return data.decode("utf-8", errors="replace")
        stats.skipped_documents += 1
        return None


def _open(f: InputFile):
    # A zstandard reader can't be iterated by line, which JSONL needs: hence the BufferedReader.
    if _is_url(f.path):
        import fsspec

        stream = fsspec.open(f.path, "rb", compression=f.compression).open()
        return io.BufferedReader(stream) if f.compression == "zstd" else stream
    if f.compression == "gzip":
        return gzip.open(f.path, "rb")
    if f.compression == "zstd":
        return io.BufferedReader(zstandard.open(f.path, "rb"))
    return open(f.path, "rb")


def _jsonl_docs(f: InputFile, opts: ReadOptions, stats: ReadStats, stream) -> Iterator[str]:
    for lineno, raw in enumerate(stream, 1):
        if lineno == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        if not raw.strip():
            continue
        where = f"{f.path} line {lineno}"
        line = decode(raw, opts.on_decode_error, where, stats)
        if line is None:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{where}: not valid JSON ({e.msg}); JSONL needs one JSON object per line"
            ) from None
        except (ValueError, RecursionError) as e:  # an integer of over 4300 digits, deep nesting
            raise DataError(
                f"{where}: JSON that can't be parsed ({str(e).split(';')[0]}); fix or remove the line"
            ) from None
        if not isinstance(record, dict):
            raise DataError(
                f"{where}: expected a JSON object, got {type(record).__name__}; JSONL needs one object per line"
            )
        if opts.text_field not in record:
            raise DataError(
                f"{where}: no field {opts.text_field!r} (fields: {', '.join(map(str, record)) or 'none'}); "
                "pass --text-field NAME"
            )
        text = record[opts.text_field]
        if text is None:
            yield ""
        elif not isinstance(text, str):
            raise DataError(
                f"{where}: field {opts.text_field!r} is a {type(text).__name__}, not a string"
            )
        else:
            text = _valid_unicode(text, opts.on_decode_error, where, stats)
            if text is not None:
                yield text


def _parquet_docs(f: InputFile, opts: ReadOptions, stats: ReadStats, stream) -> Iterator[str]:
    source = pa.BufferReader(stream.read()) if f.compression else stream
    pf = pq.ParquetFile(source)
    names = pf.schema_arrow.names
    if opts.parquet_column not in names:
        raise DataError(
            f"{f.path}: no column {opts.parquet_column!r} (columns: {', '.join(names)}); pass --parquet-column NAME"
        )
    kind = pf.schema_arrow.field(opts.parquet_column).type
    if kind not in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
        raise DataError(
            f"{f.path}: column {opts.parquet_column!r} holds {kind}, not text; pass --parquet-column NAME"
        )
    row = 0
    for batch in pf.iter_batches(columns=[opts.parquet_column], batch_size=1024):
        # As bytes: a string column can hold invalid UTF-8 too, which --on-decode-error handles.
        for value in batch.column(0).cast(pa.large_binary()).to_pylist():
            row += 1
            if value is None:
                yield ""
                continue
            text = decode(value, opts.on_decode_error, f"{f.path} row {row}", stats)
            if text is not None:
                yield text


def _text_docs(f: InputFile, opts: ReadOptions, stats: ReadStats, stream) -> Iterator[str]:
    """A file is one document; a UTF-8 BOM (Windows editors write one) is not its text."""
    text = decode(stream.read().removeprefix(codecs.BOM_UTF8), opts.on_decode_error, f.path, stats)
    if text is not None:
        yield text


READERS = {TEXT: _text_docs, JSONL: _jsonl_docs, PARQUET: _parquet_docs}


def _valid_unicode(text: str, policy: DecodePolicy, where: str, stats: ReadStats) -> str | None:
    """JSON escapes can smuggle in lone surrogates, which no UTF-8 tokenizer accepts."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError as e:
        if policy == "strict":
            raise DataError(
                f"{where}: a lone surrogate {text[e.start]!r} (half of a UTF-16 pair, from a JSON "
                "escape), not a character; fix the text or pass --on-decode-error replace (or skip)"
            ) from None
        return decode(text.encode("utf-8", errors="surrogatepass"), policy, where, stats)


def read_documents(f: InputFile, opts: ReadOptions, stats: ReadStats) -> Iterator[str]:
    """The non-empty documents of one file, counting into ``stats``.

    An unreadable file (missing, corrupt archive, broken parquet) is an error under ``strict``;
    otherwise it is counted as skipped, keeping any documents read before the failure.
    """
    stats.files += 1
    try:
        with _open(f) as stream:
            for text in READERS[f.kind](f, opts, stats, stream):
                if not text:
                    stats.empty_documents += 1
                    continue
                stats.documents += 1
                stats.text_bytes += _utf8_len(text)
                yield text
    except DataError:
        raise
    except Exception as e:
        if not _is_read_failure(e):
            raise
        if opts.on_decode_error == "strict":
            raise DataError(
                f"{f.path}: can't read it ({type(e).__name__}: {e}); fix or remove the file, or pass "
                "--on-decode-error skip to skip unreadable files"
            ) from None
        stats.skipped_files += 1


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _is_read_failure(e: Exception) -> bool:
    """A damaged or missing file. Not a stream that can't do what a reader asks: that is a bug
    here, which ``--on-decode-error skip`` must not hide by skipping every such file."""
    if isinstance(e, io.UnsupportedOperation):
        return False
    return isinstance(e, (OSError, EOFError, pa.ArrowException, zstandard.ZstdError))


@dataclass
class DocBatch:
    """Tokenized documents of one file, in file order: ids and :func:`split_key` of each."""

    tokens: list[np.ndarray]
    keys: list[float]


def tokenize_file(
    f: InputFile,
    tokenizer,
    opts: ReadOptions,
    stats: ReadStats,
    docs_per_batch: int = DOCS_PER_BATCH,
    batch_chars: int = BATCH_CHARS,
) -> Iterator[DocBatch]:
    """Read one file and tokenize it ``docs_per_batch`` documents or ``batch_chars`` characters
    at a time, whichever comes first (bounded memory)."""
    texts: list[str] = []
    chars = 0

    def flush() -> DocBatch:
        nonlocal chars
        tokens = [
            check_ids(ids, tokenizer.vocab_size, f.path) for ids in tokenizer.encode_arrays(texts)
        ]
        batch = DocBatch(tokens, [split_key(t) for t in texts])
        texts.clear()
        chars = 0
        return batch

    for text in read_documents(f, opts, stats):
        texts.append(text)
        chars += len(text)
        if len(texts) >= docs_per_batch or chars >= batch_chars:
            yield flush()
    if texts:
        yield flush()


def sample_texts(files: list[InputFile], opts: ReadOptions, max_bytes: int) -> list[str]:
    """Up to ``max_bytes`` of UTF-8 text for training a BPE, from every file in order: each
    takes at most an equal share of the budget still left, so no file's large documents crowd
    out the files after it, and what a small file leaves goes to those after it."""
    sample: list[str] = []
    left = max_bytes
    for i, f in enumerate(files):
        share = left // (len(files) - i)
        if share == 0:
            continue
        texts, taken = _head(read_documents(f, opts, ReadStats()), share)
        sample += texts
        left -= taken
    return sample


def _head(texts: Iterator[str], limit: int) -> tuple[list[str], int]:
    """The documents of ``texts`` up to ``limit`` UTF-8 bytes in all, and their bytes; the one
    that crosses the limit is cut (:func:`_cut`)."""
    taken: list[str] = []
    size = 0
    for text in texts:
        whole = _utf8_len(text) <= limit - size
        piece = text if whole else _cut(text, limit - size)
        taken.append(piece)
        size += _utf8_len(piece)
        if not whole:
            break
    return [t for t in taken if t], size


def _cut(text: str, limit: int) -> str:
    """The longest start of ``text`` within ``limit`` UTF-8 bytes that ends where a run of
    whitespace starts, where the BPE's pre-tokenizer splits too (cut at the limit in text with
    no such place)."""
    head = text[:limit].encode("utf-8")[:limit].decode("utf-8", errors="ignore")
    last = deque(RUN_START.finditer(head), maxlen=1)
    return head[: last[0].start()] if last else head


def new_writer(out_dir, tokenizer, val_fraction: float, shard_tokens: int) -> DatasetWriter:
    return DatasetWriter(out_dir, TokenizerInfo(**tokenizer.identity()), val_fraction, shard_tokens)


def finish_shards(
    writer: DatasetWriter, totals: ReadStats, num_files: int, info: dict | None
) -> Manifest:
    """Write the manifest, unless no document survived reading (then say why)."""
    if totals.documents == 0:
        raise DataError(
            f"the {num_files} input file(s) held no non-empty document ({totals.skipped_files} unreadable, "
            f"{totals.skipped_documents} undecodable, {totals.empty_documents} empty); check --input, "
            "--text-field and --parquet-column"
        )
    return writer.finish(info={**(info or {}), "read": totals.to_dict()})


def write_shards(
    files: list[InputFile],
    tokenizer,
    out_dir,
    opts: ReadOptions,
    *,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    info: dict | None = None,
    on_file: Callable[[ReadStats], None] | None = None,
) -> tuple[Manifest, ReadStats]:
    """Tokenize ``files`` in this process into shards: the same output as the Ray pipeline,
    ``on_file`` called with each file's stats as the pipeline calls it."""
    writer = new_writer(out_dir, tokenizer, val_fraction, shard_tokens)
    totals = ReadStats()
    for f in files:
        stats = ReadStats()
        for docs in tokenize_file(f, tokenizer, opts, stats):
            for ids, key in zip(docs.tokens, docs.keys, strict=True):
                writer.add(ids, key, f.path)
        totals.add(stats)
        if on_file is not None:
            on_file(stats)
    return finish_shards(writer, totals, len(files), info), totals
