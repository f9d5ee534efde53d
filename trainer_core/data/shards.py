"""The token shard format: parquet files of a flat token stream plus a ``manifest.json``.

A shard dir holds ``part-NNNNN.parquet`` (training) and ``val-NNNNN.parquet`` (validation) files.
Each is a slice of one flat stream (every document followed by EOS) stored in a single column
``tokens`` of fixed-size rows (``row_tokens`` tokens, the file's last row shorter) and fixed-size
row groups (``row_group_rows`` rows). Fixed sizes make any token offset's file, row group and row
computable from the manifest alone, which is what lets the loader start at any step without
reading what comes before. The manifest records the tokenizer's identity (so a mismatch with the
model is caught before training) and each file's size and sha256 (so a truncated or altered file
is caught too); every data page carries a CRC that the reader verifies, so a flipped bit is
caught on the read that would have used it, without hashing whole files first. Documents go to
validation by a stable hash of their text, so the split does not depend on input order or
parallelism.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer_core.errors import UserError
from trainer_core.io import storage
from trainer_core.io.storage import Location

MANIFEST = "manifest.json"
FORMAT = "rayladder-shards"
FORMAT_VERSION = 1
TRAIN_PREFIX = "part"
VAL_PREFIX = "val"
DEFAULT_ROW_TOKENS = 4096
DEFAULT_ROW_GROUP_ROWS = 8
"""32K tokens per row group: small enough that a random window costs one cheap read."""
DEFAULT_SHARD_TOKENS = 1 << 26
DEFAULT_VAL_FRACTION = 0.01
RETOKENIZE = "re-run datasets/tokenize_corpus.py to rebuild the shards"


class DataError(UserError, ValueError):
    """Input data or shards are unusable; the message names the file/value and what to do."""


class ShardError(DataError):
    """A shard file's content is wrong (a page fails its checksum, an id is outside the vocab).

    Re-reading cannot fix it, so a run stops at once instead of retrying."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (vocab <= 65536), else uint32: halves the size of most corpora."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def split_key(text: str) -> float:
    """A stable number in [0, 1) from a document's text; ``< val_fraction`` means validation."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def check_ids(ids: np.ndarray, vocab_size: int, source: str = "") -> np.ndarray:
    """``ids`` unchanged if every id is in ``[0, vocab_size)``, else a DataError naming the value."""
    if ids.size:
        top, low = int(ids.max()), int(ids.min())
        if top >= vocab_size or low < 0:
            bad = top if top >= vocab_size else low
            where = f" in {source}" if source else ""
            raise DataError(
                f"token id {bad}{where} is outside the tokenizer's vocab size {vocab_size}; "
                "the tokenizer's vocab_size is wrong or the ids came from another tokenizer"
            )
    return ids


def is_shard_dir(directory: str | Path) -> bool:
    """Whether ``directory`` holds a ``manifest.json`` of this format: its files are tokens."""
    try:
        raw = json.loads((Path(directory) / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and raw.get("format") == FORMAT


def file_sha256(path: Location) -> str:
    h = hashlib.sha256()
    with storage.open_file(path) as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class TokenizerInfo:
    kind: str
    vocab_size: int
    eos_id: int
    bos_id: int | None
    content_hash: str


@dataclass
class ShardFile:
    name: str
    tokens: int
    documents: int
    """Documents whose EOS lies in this file (a document can start in the previous one)."""
    rows: int
    bytes: int
    sha256: str


@dataclass
class Manifest:
    """A parsed ``manifest.json``; ``dir`` is where it was read from (not stored in the file)."""

    tokenizer: TokenizerInfo
    dtype: str
    row_tokens: int
    row_group_rows: int
    val_fraction: float
    train: list[ShardFile]
    validation: list[ShardFile]
    info: dict = field(default_factory=dict)
    page_checksums: bool = False
    """Files carry parquet page CRCs; False in manifests written before they did."""
    dir: Location = Path(".")
    """A local dir, or a URL (``s3://bucket/prefix``) read through :mod:`trainer_core.io.storage`."""

    @property
    def path(self) -> Location:
        return storage.join(self.dir, MANIFEST)

    @property
    def num_train_tokens(self) -> int:
        return sum(f.tokens for f in self.train)

    @property
    def num_val_tokens(self) -> int:
        return sum(f.tokens for f in self.validation)

    def to_dict(self) -> dict:
        def split(files: list[ShardFile]) -> dict:
            return {
                "tokens": sum(f.tokens for f in files),
                "documents": sum(f.documents for f in files),
                "files": [asdict(f) for f in files],
            }

        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "tokenizer": asdict(self.tokenizer),
            "dtype": self.dtype,
            "row_tokens": self.row_tokens,
            "row_group_rows": self.row_group_rows,
            "val_fraction": self.val_fraction,
            "train": split(self.train),
            "validation": split(self.validation),
            "info": self.info,
            "page_checksums": self.page_checksums,
        }


def write_manifest(manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically: a dir with a manifest is a complete dir."""
    tmp = manifest.dir / f".{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
    os.replace(tmp, manifest.path)
    return manifest.path


def read_manifest(directory: Location) -> Manifest:
    directory = storage.normalize(directory)
    path = storage.join(directory, MANIFEST)
    if not storage.is_file(path):
        raise DataError(
            f"{path}: no shard manifest there; create shards with datasets/tokenize_corpus.py --out {directory}"
        )
    try:
        raw = json.loads(storage.read_text(path))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); {RETOKENIZE}") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise DataError(
            f"{path}: unreadable manifest ({type(e).__name__}: {e}); {RETOKENIZE}"
        ) from None
    if not isinstance(raw, dict):
        raise DataError(
            f"{path}: a manifest is a JSON object, this one is a {type(raw).__name__}; {RETOKENIZE}"
        )
    if raw.get("format") != FORMAT or raw.get("version") != FORMAT_VERSION:
        raise DataError(
            f"{path}: not a {FORMAT} v{FORMAT_VERSION} manifest "
            f"(format={raw.get('format')!r}, version={raw.get('version')!r}); {RETOKENIZE}"
        )
    try:
        manifest = Manifest(
            tokenizer=TokenizerInfo(**raw["tokenizer"]),
            dtype=raw["dtype"],
            row_tokens=raw["row_tokens"],
            row_group_rows=raw["row_group_rows"],
            val_fraction=raw["val_fraction"],
            train=[ShardFile(**f) for f in raw["train"]["files"]],
            validation=[ShardFile(**f) for f in raw["validation"]["files"]],
            info=raw.get("info", {}),
            page_checksums=raw.get("page_checksums", False) is True,
            dir=directory,
        )
    except (KeyError, TypeError) as e:
        raise DataError(
            f"{path}: unreadable manifest ({type(e).__name__}: {e}); {RETOKENIZE}"
        ) from None
    _check_manifest(manifest, path)
    return manifest


def _is_int(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_file_name(name: object) -> bool:
    """A name in the shard dir itself: no separator, so no path can lead out of it."""
    return isinstance(name, str) and name not in ("", ".", "..") and not {"/", "\\"} & set(name)


def _check_manifest(m: Manifest, path: Location) -> None:
    """Refuse, naming the field, a value the loader would otherwise trip over far from here
    (a division by ``row_tokens=0``, ``np.dtype("int17")``, a file name that leaves the dir)."""
    t, fraction = m.tokenizer, m.val_fraction
    number = isinstance(fraction, (int, float)) and not isinstance(fraction, bool)
    checks = [
        ("tokenizer.kind", t.kind, isinstance(t.kind, str), "a string"),
        ("tokenizer.vocab_size", t.vocab_size, _is_int(t.vocab_size, 1), "an integer >= 1"),
        ("tokenizer.eos_id", t.eos_id, _is_int(t.eos_id, 0), "an integer >= 0"),
        (
            "tokenizer.bos_id",
            t.bos_id,
            t.bos_id is None or _is_int(t.bos_id, 0),
            "null or an int >= 0",
        ),
        ("tokenizer.content_hash", t.content_hash, isinstance(t.content_hash, str), "a string"),
        ("dtype", m.dtype, m.dtype in ("uint16", "uint32"), "'uint16' or 'uint32'"),
        ("row_tokens", m.row_tokens, _is_int(m.row_tokens, 1), "an integer >= 1"),
        ("row_group_rows", m.row_group_rows, _is_int(m.row_group_rows, 1), "an integer >= 1"),
        ("val_fraction", fraction, number and 0 <= fraction < 1, "a number in [0, 1)"),
        ("info", m.info, isinstance(m.info, dict), "a JSON object"),
    ]
    for split, files in (("train", m.train), ("validation", m.validation)):
        for i, f in enumerate(files):
            at = f"{split}.files[{i}]"
            checks.append((f"{at}.name", f.name, _is_file_name(f.name), "a plain file name"))
            checks.append((f"{at}.sha256", f.sha256, isinstance(f.sha256, str), "a string"))
            for key in ("tokens", "documents", "rows", "bytes"):
                value = getattr(f, key)
                checks.append((f"{at}.{key}", value, _is_int(value, 0), "an integer >= 0"))
    for field_name, value, ok, want in checks:
        if not ok:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise DataError(f"{path}: {field_name} is {shown}, not {want}; {RETOKENIZE}")


def verify_shards(directory: Location, checksums: bool = True) -> Manifest:
    """Check every listed file exists with its recorded size and (``checksums``) sha256.

    The size check is instant and catches truncation and missing files; the checksum reads every
    byte and also catches altered files.
    """
    manifest = read_manifest(directory)
    for f in manifest.train + manifest.validation:
        path = storage.join(manifest.dir, f.name)
        if not storage.is_file(path):
            raise DataError(
                f"{path}: shard file listed in {manifest.path} is missing; {RETOKENIZE}"
            )
        size = storage.size(path)
        if size != f.bytes:
            raise DataError(
                f"{path}: shard is {size} bytes, the manifest says {f.bytes} (truncated?); {RETOKENIZE}"
            )
        if checksums and file_sha256(path) != f.sha256:
            raise DataError(
                f"{path}: sha256 differs from {manifest.path} (file altered or corrupt); {RETOKENIZE}"
            )
    return manifest


class ShardWriter:
    """Streams documents into ``<prefix>-NNNNN.parquet`` files of ``shard_tokens`` tokens each."""

    def __init__(
        self,
        out_dir: Path,
        prefix: str,
        vocab_size: int,
        eos_id: int,
        shard_tokens: int = DEFAULT_SHARD_TOKENS,
        row_tokens: int = DEFAULT_ROW_TOKENS,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        compression: str = "zstd",
    ):
        if min(shard_tokens, row_tokens, row_group_rows) < 1:
            raise DataError(
                f"shard_tokens={shard_tokens}, row_tokens={row_tokens} and row_group_rows={row_group_rows} must be >= 1"
            )
        self.out_dir, self.prefix = Path(out_dir), prefix
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self.shard_tokens, self.row_tokens, self.row_group_rows = (
            shard_tokens,
            row_tokens,
            row_group_rows,
        )
        self.compression = compression
        self.dtype = token_dtype(vocab_size)
        self.files: list[ShardFile] = []
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self._doc_ends: list[int] = []
        """Stream offsets (within the buffer) just after each buffered document's EOS."""

    @property
    def documents(self) -> int:
        return sum(f.documents for f in self.files) + len(self._doc_ends)

    def add_document(self, tokens: np.ndarray | list[int], source: str = "") -> None:
        """Append one document's ids and an EOS; ``source`` names its file in error messages."""
        ids = check_ids(np.asarray(tokens), self.vocab_size, source)
        doc = np.empty(ids.size + 1, dtype=self.dtype)
        doc[:-1] = ids
        doc[-1] = self.eos_id
        self._buffer.append(doc)
        self._buffered += doc.size
        self._doc_ends.append(self._buffered)
        while self._buffered >= self.shard_tokens:
            self._flush(self.shard_tokens)

    def finish(self) -> list[ShardFile]:
        if self._buffered:
            self._flush(self._buffered)
        return self.files

    def _flush(self, n: int) -> None:
        stream = np.concatenate(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
        head, rest = stream[:n], stream[n:]
        docs = bisect.bisect_right(self._doc_ends, n)
        self._doc_ends = [end - n for end in self._doc_ends[docs:]]
        self._buffer, self._buffered = ([rest] if rest.size else []), rest.size
        self.files.append(self._write(head, docs))

    def _write(self, tokens: np.ndarray, documents: int) -> ShardFile:
        name = f"{self.prefix}-{len(self.files):05d}.parquet"
        path = self.out_dir / name
        offsets = np.append(np.arange(0, tokens.size, self.row_tokens), tokens.size).astype(
            np.int32
        )
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))
        pq.write_table(
            pa.table({"tokens": column}),
            path,
            row_group_size=self.row_group_rows,
            compression=self.compression,
            use_dictionary=False,
            write_statistics=False,
            write_page_checksum=True,
        )
        return ShardFile(
            name=name,
            tokens=int(tokens.size),
            documents=documents,
            rows=len(offsets) - 1,
            bytes=path.stat().st_size,
            sha256=file_sha256(path),
        )


class DatasetWriter:
    """Routes documents to the train and validation writers and writes the manifest at the end.

    It writes into a new or empty dir and never deletes: replacing an existing shard dir is the
    caller's job, done only once the new one is complete (:func:`trainer_core.io.output_dir.replace_when_complete`).

    A document goes to validation when its :func:`split_key` is below ``val_fraction``. So that
    a small corpus still gets a validation split, the training documents with the smallest key
    (one text and its exact duplicates) are held back until the end and moved to validation
    together if no other document landed there: a copy left in train would make validation
    score a text the model trained on.
    """

    def __init__(
        self,
        out_dir: str | Path,
        tokenizer: TokenizerInfo,
        val_fraction: float = DEFAULT_VAL_FRACTION,
        shard_tokens: int = DEFAULT_SHARD_TOKENS,
        row_tokens: int = DEFAULT_ROW_TOKENS,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    ):
        if not 0 <= val_fraction < 1:
            raise DataError(f"val fraction {val_fraction} must be in [0, 1)")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if any(self.out_dir.iterdir()):
            raise DataError(
                f"{self.out_dir}: not empty; shards are written into a new or empty dir "
                "(datasets/tokenize_corpus.py --out builds the new shards beside the old and swaps)"
            )
        self.tokenizer, self.val_fraction = tokenizer, val_fraction
        self.row_tokens, self.row_group_rows = row_tokens, row_group_rows
        shape = dict(
            shard_tokens=shard_tokens, row_tokens=row_tokens, row_group_rows=row_group_rows
        )
        self.train = ShardWriter(
            self.out_dir, TRAIN_PREFIX, tokenizer.vocab_size, tokenizer.eos_id, **shape
        )
        self.val = ShardWriter(
            self.out_dir, VAL_PREFIX, tokenizer.vocab_size, tokenizer.eos_id, **shape
        )
        self._held_key = 1.0  # above every key: split_key is in [0, 1)
        self._held: list[tuple[np.ndarray, str]] = []
        """The documents whose key is ``_held_key``, the smallest of the training documents."""

    def add(self, tokens: np.ndarray | list[int], key: float, source: str = "") -> None:
        """Add one document; ``key`` is its :func:`split_key`."""
        if key < self.val_fraction:
            self.val.add_document(tokens, source)
        elif self.val_fraction == 0:
            self.train.add_document(tokens, source)
        elif key < self._held_key:
            for held in self._held:
                self.train.add_document(*held)
            self._held_key, self._held = key, [(np.asarray(tokens), source)]
        elif key == self._held_key:
            self._held.append((np.asarray(tokens), source))
        else:
            self.train.add_document(tokens, source)

    def finish(self, info: dict | None = None) -> Manifest:
        no_val, others = self.val.documents == 0, self.train.documents > 0
        target = self.val if no_val and others else self.train
        for held in self._held:
            target.add_document(*held)
        train, validation = self.train.finish(), self.val.finish()
        if not train:
            raise DataError(
                f"no documents were written to {self.out_dir}: the inputs held no non-empty document"
            )
        manifest = Manifest(
            tokenizer=self.tokenizer,
            dtype=str(self.train.dtype),
            row_tokens=self.row_tokens,
            row_group_rows=self.row_group_rows,
            val_fraction=self.val_fraction,
            train=train,
            validation=validation,
            info=info or {},
            page_checksums=True,
            dir=self.out_dir,
        )
        write_manifest(manifest)
        return manifest
