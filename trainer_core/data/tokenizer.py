"""Tokenizers that never download anything: byte-level, a BPE trained here, or a local file.

All of them share one small interface (:class:`Tokenizer`): ``encode_batch``, ``vocab_size``,
``eos_id``, ``bos_id``, ``kind``, ``content_hash`` and ``save``. The hash identifies the exact
vocabulary and rules, so a shard manifest can tell whether shards were made by the tokenizer a
run expects. Documents are encoded without special tokens, a special token's text in them as
plain text; the shard writer appends EOS itself.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from trainer_core.data.shards import DataError

HF_FILE = "tokenizer.json"
HF_CONFIG = "tokenizer_config.json"
BYTE_FILE = "byte_tokenizer.json"
"""Marker file :meth:`ByteTokenizer.save` writes so that a shard dir names its tokenizer."""

EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "<|end_of_text|>", "[SEP]")
BOS_NAMES = ("<|bos|>", "<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]")
BPE_SPECIALS = ("<|endoftext|>", "<|bos|>", "<|pad|>")
CHUNK_CHARS = 1 << 20
"""A longer document is encoded in pieces of about this size, where the tokenizer allows it:
encoding takes ~160 bytes of memory per byte of text, 3 GB for a 20 MB document at once."""
RUN_START = re.compile(r"(?<=\S)[ \n]")
"""Where a whitespace run starts (Python's ``\\S`` is narrower than a tokenizer's, so safe)."""


class Continuation(NamedTuple):
    """A scored continuation's tokens, the context's before them, and the UTF-8 bytes the
    continuation's tokens cover (for bits per byte)."""

    context: np.ndarray
    ids: np.ndarray
    nbytes: int


class Tokenizer(ABC):
    """What the shard writer and the data loader need from a tokenizer."""

    kind: str
    vocab_size: int
    eos_id: int
    bos_id: int | None

    @abstractmethod
    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text as an integer array (the fast path the shard writer uses)."""

    @abstractmethod
    def encode_continuations(self, context: str, continuations: list[str]) -> list[Continuation]:
        """Each continuation as the model meets it after ``context`` in training text: context
        and continuation encoded as one text, the tokens that cover any of the continuation's
        characters (one that spans the boundary, such as a space-prefixed word after a context
        ending in a space, among them) are the continuation's; encoded apart, the two would meet
        at a token boundary the training data never had."""

    @property
    @abstractmethod
    def content_hash(self) -> str:
        """A hex digest that changes whenever the mapping from text to ids could change."""

    @abstractmethod
    def save(self, directory: str | Path) -> Path:
        """Write the tokenizer into ``directory`` so :func:`load_tokenizer` reads it back."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [ids.tolist() for ids in self.encode_arrays(texts)]

    def identity(self) -> dict:
        """The fields a shard manifest records to tie shards to this tokenizer."""
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "bos_id": self.bos_id,
            "content_hash": self.content_hash,
        }


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0-255, then EOS=256, BOS=257, PAD=258: no vocabulary file at all."""

    kind = "byte"
    vocab_size = 259
    eos_id = 256
    bos_id = 257
    pad_id = 258

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def encode_continuations(self, context: str, continuations: list[str]) -> list[Continuation]:
        (ids,) = self.encode_arrays([context])  # bytes: no token spans a boundary
        return [Continuation(ids, c_ids, len(c_ids)) for c_ids in self.encode_arrays(continuations)]

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(b"rayladder-byte-tokenizer-v1").hexdigest()

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / BYTE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"kind": self.kind, "vocab_size": self.vocab_size}) + "\n")
        return path


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer (a ``tokenizer.json``), e.g. one :func:`train_bpe` made."""

    kind = "hf"

    def __init__(self, tok, eos_token: str, bos_token: str | None):
        self.tok = tok
        tok.encode_special_tokens = True  # '<|endoftext|>' in a document is text, not its end
        self.chunkable = _pieces_join_exactly(tok)
        self.eos_token, self.bos_token = eos_token, bos_token
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = tok.token_to_id(eos_token)
        self.bos_id = tok.token_to_id(bos_token) if bos_token else None
        payload = json.dumps({"tokenizer": tok.to_str(), "eos": eos_token, "bos": bos_token})
        self._hash = hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def __setstate__(self, state: dict) -> None:
        """A pickle (Ray sends the tokenizer to its tasks) drops ``encode_special_tokens``."""
        self.__dict__.update(state)
        self.tok.encode_special_tokens = True

    @classmethod
    def from_file(cls, path: Path) -> HFTokenizer:
        """Load a tokenizer.json; a ``tokenizer_config.json`` beside it may name EOS/BOS."""
        try:
            tok = RawTokenizer.from_file(str(path))
        except Exception as e:
            raise DataError(
                f"{path}: not a readable tokenizer.json ({e}); point --tokenizer at a valid one"
            ) from None
        config_file = path.parent / HF_CONFIG
        try:
            config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        except UnicodeDecodeError as e:
            raise DataError(
                f"{config_file}: not UTF-8 text (byte {e.start}); fix or remove it"
            ) from None
        except json.JSONDecodeError as e:
            raise DataError(f"{config_file}: not valid JSON ({e}); fix or remove it") from None
        if not isinstance(config, dict):
            raise DataError(
                f"{config_file}: a {type(config).__name__}, not a JSON object of settings such as "
                "eos_token; fix or remove it"
            )
        eos = _token_name(config.get("eos_token")) or _first_present(tok, EOS_NAMES)
        if eos is None or tok.token_to_id(eos) is None:
            raise DataError(
                f"{path}: no end-of-document token found (looked for {', '.join(EOS_NAMES)} and "
                f"eos_token in {HF_CONFIG}); add one of them as a special token"
            )
        bos = _token_name(config.get("bos_token")) or _first_present(tok, BOS_NAMES)
        return cls(tok, eos, bos if bos and tok.token_to_id(bos) is not None else None)

    def encode_arrays(self, texts: list[str], chunk_chars: int = CHUNK_CHARS) -> list[np.ndarray]:
        if not self.chunkable or max(map(len, texts), default=0) <= chunk_chars:
            return self._encode(texts)
        return [
            np.concatenate([self._encode([piece])[0] for piece in _pieces(t, chunk_chars)])
            for t in texts
        ]

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self.tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def encode_continuations(self, context: str, continuations: list[str]) -> list[Continuation]:
        out = []
        whole = [context + c for c in continuations]
        for text, e in zip(
            whole, self.tok.encode_batch(whole, add_special_tokens=False), strict=True
        ):
            ids = np.asarray(e.ids, dtype=np.int64)
            # Character offsets: the first token that ends inside the continuation starts it.
            split = next(
                (i for i, (_, end) in enumerate(e.offsets) if end > len(context)), len(ids)
            )
            start = e.offsets[split][0] if split < len(ids) else len(text)
            out.append(Continuation(ids[:split], ids[split:], len(text[start:].encode("utf-8"))))
        return out

    @property
    def content_hash(self) -> str:
        return self._hash

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tok.save(str(directory / HF_FILE))
        config = {"eos_token": self.eos_token, "bos_token": self.bos_token}
        (directory / HF_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        return directory / HF_FILE


def _token_name(value: object) -> str | None:
    """``eos_token`` in a tokenizer_config.json is a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _first_present(tok, names: Iterable[str]) -> str | None:
    return next((n for n in names if tok.token_to_id(n) is not None), None)


def _pieces_join_exactly(tok) -> bool:
    """Whether a text's ids are its :func:`_pieces`' ids joined: so for byte-level pre-tokenizing
    by the GPT-2 regex, where no pre-token runs from a non-space into a space, unless a
    normalizer, a prefix space or a non-special added token acts across the whole text."""
    pre = tok.pre_tokenizer
    return (
        isinstance(pre, pre_tokenizers.ByteLevel)
        and pre.use_regex
        and not pre.add_prefix_space
        and tok.normalizer is None
        and all(t.special for t in tok.get_added_tokens_decoder().values())
    )


def _pieces(text: str, size: int) -> Iterator[str]:
    """``text`` in pieces of ``size`` characters or a little more, each cut where a run of
    whitespace starts (the rest is one piece if it has no such place)."""
    start = 0
    while cut := RUN_START.search(text, start + size):
        yield text[start : cut.start()]
        start = cut.start()
    yield text[start:]


def train_bpe(texts: Iterable[str], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE trained on ``texts`` here (no download), with EOS/BOS/PAD specials.

    Byte-level means every input is encodable, so the vocabulary must hold the 256 byte symbols
    and the 3 specials. A small sample can yield fewer merges than asked for.
    """
    minimum = 256 + len(BPE_SPECIALS)
    if vocab_size < minimum:
        raise DataError(
            f"--train-bpe {vocab_size}: a byte-level BPE needs a vocab size >= {minimum}"
        )
    tok = RawTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(BPE_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return HFTokenizer(tok, BPE_SPECIALS[0], BPE_SPECIALS[1])


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """``"byte"``, a ``tokenizer.json`` file, or a directory holding one (HF layout) or a byte marker."""
    if str(spec) == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / HF_FILE).is_file():
            return HFTokenizer.from_file(path / HF_FILE)
        if (path / BYTE_FILE).is_file():
            return ByteTokenizer()
        raise DataError(
            f"tokenizer dir {str(path)!r} holds no {HF_FILE}; use 'byte' or a dir/file with a {HF_FILE}"
        )
    if path.is_file():
        return HFTokenizer.from_file(path)
    raise DataError(
        f"tokenizer {str(spec)!r} not found: use 'byte', a path to a {HF_FILE}, or a dir holding one"
    )
