"""Training data: token shards -> position-addressable batches of (seq_len+1)-token windows.

Each source's training stream is cut into windows of ``seq_len + 1`` tokens (inputs plus the
shifted labels) at stride ``seq_len``; windows never cross a parquet file, so window ``i``'s file
and offset follow from the manifest's token counts. The order is a pure function of the seed:

* a *slot* is one window position in the run's global stream; step ``k`` with a global batch of
  ``B`` sequences is slots ``[k*B, (k+1)*B)``, and data-parallel rank ``r`` of ``dp`` gets the
  contiguous slice ``[r*B/dp, (r+1)*B/dp)`` of it;
* each source's windows are visited in a fresh permutation every epoch (seeded by seed, source
  and epoch); when an epoch runs out the next epoch's permutation continues;
* a mix of sources assigns slots in blocks of :data:`MIX_BLOCK`: each block holds a fixed quota
  per source (the weights, rounded), shuffled per block, so the source of any slot and how many
  windows of that source came before it are computed without looking at earlier blocks.

So any step's batch is computed directly (``start_step`` reads nothing before it), a resumed run
gets exactly the batches of an uninterrupted one, and the Ray Data reader
(:mod:`trainer_core.ray.reader`) reproduces them from the same :class:`TokenDataSpec`.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from trainer_core.config.sections import DataConfig
from trainer_core.data.demo_corpus import demo_shards
from trainer_core.data.row_groups import (
    CACHE_BYTES,
    RowGroupCache,
    ShardLayout,
)
from trainer_core.data.shards import (
    RETOKENIZE,
    DataError,
    Manifest,
    ShardFile,
    verify_shards,
)
from trainer_core.data.tokenizer import load_tokenizer
from trainer_core.errors import RunWarning
from trainer_core.io import storage

if TYPE_CHECKING:
    import torch

MIX_BLOCK = 4096
"""Slots per mixing block: a source's share is its weight rounded to 1/MIX_BLOCK."""
OPEN_FILES = 64
EPOCHS_KEPT = 2
"""Permutations cached per source: a step can end one epoch and start the next."""


@dataclass(frozen=True)
class TokenDataSpec:
    """A small picklable description of what to read, built on the driver, opened anywhere.

    ``sources`` are (absolute shard dir, weight) pairs. ``demo_tokenizer`` set means the built-in
    demo corpus instead: every node builds (or reuses) its own identical cached copy.
    """

    sources: tuple[tuple[str, float], ...] = ()
    demo_tokenizer: str | None = None
    verify_checksums: bool = False


def apportion(total: int, weights: Sequence[float]) -> np.ndarray:
    """Integer shares of ``total`` proportional to ``weights`` (largest remainder, ties by order)."""
    w = np.asarray(weights, dtype=np.float64)
    exact = total * w / w.sum()
    shares = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - shares), kind="stable")
    shares[order[: total - int(shares.sum())]] += 1
    return shares


def read_mix(path: str | Path) -> tuple[tuple[str, float], ...]:
    """A mix YAML ``{shard dir: weight}``; relative dirs are relative to the YAML file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(
            f"mix file {str(path)!r} not found; data.mix must name a YAML file of {{shard dir: weight}}"
        )
    try:
        raw = yaml.safe_load(path.read_text())
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}: not UTF-8 text (byte {e.start}); a mix is a YAML file of {{shard dir: weight}}"
        ) from None
    except yaml.YAMLError as e:
        raise DataError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(raw, dict) or not raw:
        raise DataError(
            f"{path}: a mix must be a non-empty mapping of shard dir -> weight, e.g. 'shards/web: 0.7'"
        )
    sources = []
    for key, weight in raw.items():
        number = isinstance(weight, (int, float)) and not isinstance(weight, bool)
        if not (number and 0 < weight <= sys.float_info.max):
            raise DataError(
                f"{path}: weight of {key!r} is {weight!r}; weights must be finite numbers > 0"
            )
        source = key if storage.is_url(key) else path.parent / str(key)
        sources.append((str(storage.normalize(source, absolute=True)), float(weight)))
    if not math.isfinite(sum(w for _, w in sources)):
        raise DataError(f"{path}: the weights sum to more than a float holds; scale them down")
    return tuple(sources)


def resolve_spec(cfg: DataConfig) -> TokenDataSpec:
    if cfg.mix:
        return TokenDataSpec(read_mix(cfg.mix), verify_checksums=cfg.verify_checksums)
    if cfg.shards:
        path = str(storage.normalize(cfg.shards, absolute=True))
        return TokenDataSpec(((path, 1.0),), verify_checksums=cfg.verify_checksums)
    return TokenDataSpec(demo_tokenizer=cfg.tokenizer, verify_checksums=cfg.verify_checksums)


def open_token_data(
    cfg: DataConfig, model_vocab_size: int, vocab_key: str = "model.vocab_size"
) -> TokenData:
    """Open the configured shards (or the demo corpus) and check they fit the model's vocab,
    set by ``vocab_key`` (a ladder's is its own ``vocab_size``)."""
    data = TokenData.open(resolve_spec(cfg))
    info = data.manifest.tokenizer
    if info.vocab_size > model_vocab_size:
        raise DataError(
            f"{data.manifest.path}: the shards' tokenizer ({info.kind}) has vocab_size {info.vocab_size}, "
            f"more than {vocab_key}={model_vocab_size}; set {vocab_key} >= {info.vocab_size}"
        )
    if (
        (cfg.shards or cfg.mix)
        and cfg.tokenizer != DataConfig.tokenizer
        and load_tokenizer(cfg.tokenizer).content_hash != info.content_hash
    ):
        raise DataError(
            f"{data.manifest.path}: shards were made by another tokenizer than data.tokenizer="
            f"{cfg.tokenizer!r}; re-tokenize with it or leave data.tokenizer unset"
        )
    return data


class Split:
    """One split (train or validation) of one shard dir: window index <-> (file, token offset)."""

    def __init__(self, manifest: Manifest, files: list[ShardFile]):
        self.manifest = manifest
        self.paths = [storage.join(manifest.dir, f.name) for f in files]
        self.tokens = np.array([f.tokens for f in files], dtype=np.int64)
        self.layout = ShardLayout(
            np.dtype(manifest.dtype),
            manifest.tokenizer.vocab_size,
            manifest.row_tokens,
            manifest.row_group_rows,
        )
        self._starts: dict[int, np.ndarray] = {}

    def window_starts(self, seq_len: int) -> np.ndarray:
        """First window index of each file, plus the total at the end."""
        starts = self._starts.get(seq_len)
        if starts is None:
            per_file = _windows_per_file(self.tokens, seq_len)
            starts = self._starts[seq_len] = np.concatenate([[0], np.cumsum(per_file)])
        return starts

    def num_windows(self, seq_len: int) -> int:
        return int(self.window_starts(seq_len)[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.sum())

    def left_out(self, seq_len: int) -> int:
        """Tokens no window trains on: windows never cross a file, so each file's tail past its
        last full stride (a whole file shorter than a window) is never read."""
        return self.num_tokens - self.num_windows(seq_len) * seq_len

    def locate(self, windows: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(file index, token offset in that file) of each window."""
        starts = self.window_starts(seq_len)
        files = np.searchsorted(starts, windows, side="right") - 1
        return files, (windows - starts[files]) * seq_len

    def read(
        self, windows: np.ndarray, seq_len: int, cache: RowGroupCache, out: np.ndarray
    ) -> None:
        """Fill ``out[i]`` with window ``windows[i]`` (``seq_len + 1`` tokens)."""
        g = self.layout.group_tokens
        for i, (f, offset) in enumerate(zip(*self.locate(windows, seq_len), strict=True)):
            path, file_tokens = self.paths[f], int(self.tokens[f])
            start = pos = int(offset)
            end = start + seq_len + 1
            while pos < end:
                index, within = divmod(pos, g)
                group = cache.group(path, index, file_tokens, self.layout)
                take = min(end - pos, g - within)
                out[i, pos - start : pos - start + take] = group[within : within + take]
                pos += take


class WindowOrder:
    """Global slot -> (source, window of that source's training split), a pure function of the seed."""

    def __init__(self, windows: Sequence[int], weights: Sequence[float], seed: int):
        self.windows = np.asarray(windows, dtype=np.int64)
        self.seed = seed % (1 << 63)
        self.quotas = apportion(MIX_BLOCK, weights) if len(windows) > 1 else None
        self._perms: list[OrderedDict[int, np.ndarray]] = [OrderedDict() for _ in windows]
        self._blocks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def consumed(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Source of each slot and how many windows of that source the stream used before it."""
        slots = np.asarray(slots, dtype=np.int64)
        if self.quotas is None:
            return np.zeros_like(slots), slots
        blocks, within = np.divmod(slots, MIX_BLOCK)
        sources, before = np.empty_like(slots), np.empty_like(slots)
        for b in np.unique(blocks):
            layout, rank = self._block(int(b))
            sel = blocks == b
            sources[sel] = layout[within[sel]]
            before[sel] = b * self.quotas[sources[sel]] + rank[within[sel]]
        return sources, before

    def locate(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, window index in its training split) of each slot."""
        sources, before = self.consumed(slots)
        windows = np.empty_like(before)
        for s in np.unique(sources):
            sel = sources == s
            epochs, index = np.divmod(before[sel], self.windows[s])
            picked = np.empty_like(index)
            for e in np.unique(epochs):
                at = epochs == e
                picked[at] = self.permutation(int(s), int(e))[index[at]]
            windows[sel] = picked
        return sources, windows

    def permutation(self, source: int, epoch: int) -> np.ndarray:
        """Source ``source``'s window order in ``epoch``.

        Each source keeps its own :data:`EPOCHS_KEPT` latest epochs (the one being read and the
        next), so steps read in order build every permutation once, however many sources the mix
        has and however fast a small source cycles through its epochs.
        """
        kept = self._perms[source]
        perm = kept.get(epoch)
        if perm is None:
            rng = np.random.default_rng([self.seed, 0, source, epoch])
            perm = kept[epoch] = rng.permutation(int(self.windows[source]))
            if len(kept) > EPOCHS_KEPT:
                kept.popitem(last=False)
        return perm

    def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """The block's source per position, and each position's rank among its source's."""
        hit = self._blocks.get(block)
        if hit is None:
            rng = np.random.default_rng([self.seed, 1, block])
            layout = rng.permutation(np.repeat(np.arange(len(self.quotas)), self.quotas))
            order = np.argsort(layout, kind="stable")
            first = np.concatenate([[0], np.cumsum(self.quotas)[:-1]])
            rank = np.empty(MIX_BLOCK, dtype=np.int64)
            rank[order] = np.arange(MIX_BLOCK) - first[layout[order]]
            hit = self._blocks[block] = (layout, rank)
            if len(self._blocks) > 8:
                self._blocks.popitem(last=False)
        return hit


class TokenData:
    """Opened shards (one dir or a weighted mix) that serve train and eval batches."""

    def __init__(
        self, spec: TokenDataSpec, manifests: list[Manifest], cache_bytes: int = CACHE_BYTES
    ):
        self.spec, self.manifests = spec, manifests
        self.weights = [w for _, w in spec.sources] if spec.sources else [1.0]
        first = manifests[0]
        for m in manifests[1:]:
            if m.tokenizer.content_hash != first.tokenizer.content_hash:
                raise DataError(
                    f"mix sources use different tokenizers: {first.dir} ({first.tokenizer.kind}, "
                    f"vocab {first.tokenizer.vocab_size}) vs {m.dir} ({m.tokenizer.kind}, vocab "
                    f"{m.tokenizer.vocab_size}); tokenize every source with the same --tokenizer"
                )
        quotas = apportion(MIX_BLOCK, self.weights)
        for (path, _), quota in zip(spec.sources, quotas, strict=False):
            if quota == 0:
                raise DataError(
                    f"mix weight of {path} is below 1/{MIX_BLOCK} of the total; raise it or drop the source"
                )
        self.train = [Split(m, m.train) for m in manifests]
        self.val = [Split(m, m.validation) for m in manifests]
        self.cache = RowGroupCache(cache_bytes)
        self._orders: dict[tuple[int, int], WindowOrder] = {}

    @classmethod
    def open(cls, spec: TokenDataSpec) -> TokenData:
        if spec.demo_tokenizer is not None:
            dirs = [demo_shards(tokenizer=spec.demo_tokenizer)]
        else:
            dirs = [storage.normalize(d) for d, _ in spec.sources]
        if not dirs:
            raise DataError(
                "no shard dirs to read; set data.shards or data.mix (or neither for the demo corpus)"
            )
        manifests = [verify_shards(d, checksums=spec.verify_checksums) for d in dirs]
        for m in manifests:
            if not (m.page_checksums or spec.verify_checksums):
                warnings.warn(
                    f"{m.dir}: shards written without page checksums, so a corrupted page would "
                    f"go unnoticed; {RETOKENIZE}, or set data.verify_checksums=true",
                    RunWarning,
                    stacklevel=2,
                )
        return cls(spec, manifests)

    @property
    def manifest(self) -> Manifest:
        return self.manifests[0]

    @property
    def content_id(self) -> str:
        """What the batches are drawn from, by content: every source's files (name, tokens,
        sha256), its tokenizer and its share of each mixing block (so weights 1:1 and 2:2 are
        one mix). A moved copy of the corpus keeps it; shards tokenized again from other text,
        another tokenizer or a reweighted mix change it."""
        quotas = apportion(MIX_BLOCK, self.weights).tolist()
        parts = [
            [
                quota,
                m.tokenizer.content_hash,
                [[f.name, f.tokens, f.sha256] for f in (*m.train, *m.validation)],
            ]
            for quota, m in zip(quotas, self.manifests, strict=True)
        ]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    @property
    def vocab_size(self) -> int:
        return self.manifest.tokenizer.vocab_size

    @property
    def eos_id(self) -> int:
        return self.manifest.tokenizer.eos_id

    @property
    def num_train_tokens(self) -> int:
        return sum(m.num_train_tokens for m in self.manifests)

    def order(self, seq_len: int, seed: int) -> WindowOrder:
        key = (seq_len, seed)
        if key not in self._orders:
            counts = [s.num_windows(seq_len) for s in self.train]
            for split, n in zip(self.train, counts, strict=True):
                if n == 0:
                    raise _no_window(split, seq_len, "training")
            self._orders[key] = WindowOrder(counts, self.weights, seed)
        return self._orders[key]

    def read_slots(self, slots: np.ndarray, seq_len: int, seed: int) -> np.ndarray:
        """The windows at global slots ``slots`` as an int64 array [len(slots), seq_len + 1]."""
        sources, windows = self.order(seq_len, seed).locate(slots)
        return self._read(self.train, sources, windows, seq_len)

    def _read(
        self, splits: list[Split], sources: np.ndarray, windows: np.ndarray, seq_len: int
    ) -> np.ndarray:
        out = np.empty((len(windows), seq_len + 1), dtype=np.int64)
        if len(splits) == 1:
            splits[0].read(windows, seq_len, self.cache, out)
            return out
        for s in np.unique(sources):
            sel = np.flatnonzero(sources == s)
            part = np.empty((sel.size, seq_len + 1), dtype=np.int64)
            splits[s].read(windows[sel], seq_len, self.cache, part)
            out[sel] = part
        return out

    def rank_slots(
        self, step: int, global_batch_seqs: int, dp_rank: int, dp_size: int
    ) -> np.ndarray:
        """The global slots of rank ``dp_rank``'s share of step ``step``."""
        per_rank = rank_batch_size(global_batch_seqs, dp_rank, dp_size)
        first = step * global_batch_seqs + dp_rank * per_rank
        return np.arange(first, first + per_rank, dtype=np.int64)

    def train_batches(
        self,
        seq_len: int,
        global_batch_seqs: int,
        seed: int,
        start_step: int = 0,
        dp_rank: int = 0,
        dp_size: int = 1,
    ) -> Iterator[torch.Tensor]:
        """Endless int64 batches [global_batch_seqs/dp_size, seq_len+1] from step ``start_step`` on."""
        import torch  # not at module level: Ray Data's read tasks import this module

        rank_batch_size(global_batch_seqs, dp_rank, dp_size)
        if start_step < 0:
            raise DataError(f"start_step {start_step} must be >= 0")
        self.order(seq_len, seed)

        def batches() -> Iterator[torch.Tensor]:
            step = start_step
            while True:
                slots = self.rank_slots(step, global_batch_seqs, dp_rank, dp_size)
                yield torch.from_numpy(self.read_slots(slots, seq_len, seed))
                step += 1

        return batches()

    def repeats(self, seq_len: int, train_seqs: int, eval_seqs: int) -> list[str]:
        """What a run of ``train_seqs`` training and ``eval_seqs`` eval windows would read twice,
        one line per source. Epochs past the first flatten the loss curve a scaling law is read
        from, and an eval window counted twice weighs double in every eval loss; both are silent
        otherwise (training wraps into the next epoch, evaluation wraps around its split). Where
        files too short for their windows leave tokens out, the line says so: the repeat is then
        the sharding's doing, not the corpus's size. A split with no window to give the windows
        asked of it: DataError, as the run would raise."""
        lines = []
        for split, val, weight, quota in zip(
            self.train, self.val, self.weights, apportion(eval_seqs, self.weights), strict=True
        ):
            where = split.manifest.dir
            windows = split.num_windows(seq_len)
            if train_seqs and windows == 0:
                raise _no_window(split, seq_len, "training")
            needed = train_seqs * weight / sum(self.weights)
            if needed > windows:
                lines.append(_train_repeats(split, seq_len, needed))
            n = _eval_windows(val, quota, seq_len)
            if n < quota:
                lines.append(
                    f"{where}: {quota:,} eval windows asked of a validation split of {n:,}, so "
                    f"{_counted_again(quota, n)}; eval at most {n * seq_len:,} tokens "
                    "(trainer.eval_batches, or a ladder's eval_tokens) or re-tokenize with a "
                    f"larger --val-fraction{_left_out_note(val, seq_len, 'validation')}"
                )
        return lines

    def eval_batches(
        self, seq_len: int, batch_seqs: int, num_batches: int, dp_rank: int = 0, dp_size: int = 1
    ) -> list[torch.Tensor]:
        """The same ``num_batches`` validation batches on every call: windows spread evenly over
        each source's validation split, sources in proportion to their weights."""
        import torch  # not at module level: Ray Data's read tasks import this module

        per_rank = rank_batch_size(batch_seqs, dp_rank, dp_size)
        total = batch_seqs * num_batches
        if total == 0:
            return []
        chosen: list[tuple[float, int, int]] = []
        for s, (split, quota) in enumerate(
            zip(self.val, apportion(total, self.weights), strict=True)
        ):
            n = _eval_windows(split, quota, seq_len)
            picks = (np.arange(quota) * n) // quota if quota <= n else np.arange(quota) % max(n, 1)
            chosen += [((j + 0.5) / quota, s, int(w)) for j, w in enumerate(picks)]
        chosen.sort()
        sources = np.array([s for _, s, _ in chosen])
        windows = np.array([w for _, _, w in chosen], dtype=np.int64)
        out = self._read(self.val, sources, windows, seq_len)
        first = dp_rank * per_rank
        return [
            torch.from_numpy(out[b * batch_seqs + first : b * batch_seqs + first + per_rank].copy())
            for b in range(num_batches)
        ]


def _windows_per_file(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Windows of ``seq_len + 1`` tokens at stride ``seq_len`` in files of ``tokens`` tokens."""
    return np.maximum((tokens - 1) // seq_len, 0)


def _eval_windows(split: Split, quota: int, seq_len: int) -> int:
    """The windows of a validation ``split``, refused when ``quota`` are asked of none: the
    planning (:meth:`TokenData.repeats`) and the run say it alike, before any training."""
    n = split.num_windows(seq_len)
    if quota and n == 0:
        raise _no_window(split, seq_len, "validation")
    return n


def _no_window(split: Split, seq_len: int, which: str) -> DataError:
    """Why a ``which`` ("training"/"validation") split gives no window, and the fix: files
    shorter than a window (a small ``--shard-tokens``) want other shards, not more text."""
    total, need, path = split.num_tokens, seq_len + 1, split.manifest.path
    if total < need and which == "validation":
        return DataError(
            f"{path}: the validation split ({total} tokens) has no window of seq_len+1 = {need} "
            "tokens; re-tokenize with a larger --val-fraction or set trainer.eval_batches=0 "
            "(a ladder's eval_tokens=0)"
        )
    if total < need:
        return DataError(
            f"{path}: the training split holds {total} tokens, fewer than seq_len+1 = {need}; "
            "use a shorter data.seq_len or more text"
        )
    longest = int(split.tokens.max())
    shorter = f", or set data.seq_len <= {longest - 1}" if longest > 1 else ""
    return DataError(
        f"{path}: the {which} split holds {total:,} tokens, but none of its {len(split.tokens):,} "
        f"files holds a window of seq_len+1 = {need} (the longest has {longest:,}; windows never "
        f"cross a file); re-tokenize with --shard-tokens >= {need} "
        f"({_shard_tokens(seq_len)} or more leaves under 1% of the tokens out){shorter}"
    )


def _shard_tokens(seq_len: int) -> int:
    """The least ``--shard-tokens`` whose full files' tails leave out under 1% of them whatever
    their alignment: a tail is at most ``seq_len`` tokens (a split's last, shorter file can
    leave a little more)."""
    return 100 * seq_len + 1


def _left_out_note(split: Split, seq_len: int, which: str) -> str:
    """``"; <how many tokens the windows leave out, why, and the fix>"`` where short files
    leave out over 1% of a ``which`` split more than one file of it would, else ``""``."""
    left_out, total = split.left_out(seq_len), split.num_tokens
    one_file = total - int(_windows_per_file(np.array(total), seq_len)) * seq_len
    if (left_out - one_file) * 100 <= total:
        return ""
    return (
        f"; windows of seq_len+1 = {seq_len + 1} tokens never cross a file, so the tails of the "
        f"{which} split's {len(split.tokens):,} files ({int(split.tokens.max()):,} tokens at most) "
        f"leave {left_out:,} of its {total:,} tokens ({100 * left_out / total:.2g}%) out: "
        f"re-tokenize with --shard-tokens >= {_shard_tokens(seq_len)} to leave out under 1%"
    )


def _train_repeats(split: Split, seq_len: int, needed: float) -> str:
    """The line for a run reading ``needed`` windows of a training split holding fewer: more
    text or fewer tokens is the fix unless short files are what left the windows short."""
    windows = split.num_windows(seq_len)
    said = (
        f"{split.manifest.dir}: the run reads its {windows:,} training windows "
        f"{needed / windows:.2g} times over; repeated data bends the loss curve a scaling law is "
        "fitted to"
    )
    note = _left_out_note(split, seq_len, "training")
    if note and needed * seq_len <= 0.99 * split.num_tokens:
        return f"{said}{note}"
    return f"{said} (use more text, or train fewer tokens){note}"


def _counted_again(asked: int, windows: int) -> str:
    """How often eval windows count when ``asked`` (> ``windows``) are taken round a split of
    ``windows`` (:meth:`TokenData.eval_batches`): each ``asked // windows`` times or once more."""
    if asked < 2 * windows:
        return f"{asked - windows:,} count twice"
    return f"each counts up to {-(-asked // windows):,} times"


def rank_batch_size(global_batch_seqs: int, dp_rank: int, dp_size: int) -> int:
    """Sequences per rank; the global batch must split evenly over the data-parallel ranks."""
    if global_batch_seqs < 1 or dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise DataError(
            f"bad batch layout: global_batch_seqs={global_batch_seqs}, dp_rank={dp_rank}, dp_size={dp_size}"
        )
    if global_batch_seqs % dp_size:
        raise DataError(
            f"global batch of {global_batch_seqs} sequences can't be split evenly over {dp_size} data-parallel ranks"
        )
    return global_batch_seqs // dp_size
