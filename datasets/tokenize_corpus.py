"""Tokenize raw text into rayladder token shards with Ray Data.

    python datasets/tokenize_corpus.py --input 'corpus/*.jsonl' --out shards/
    python datasets/tokenize_corpus.py --input docs/ --input extra.parquet --train-bpe 8192 --out shards/

Inputs: text files (one document each), JSONL (``--text-field``), parquet (``--parquet-column``),
optionally .gz/.zst compressed; files, directories (recursive), quoted globs or s3://, gs:// URLs.
Starts a local Ray, or joins the cluster named by RAY_ADDRESS (as under ``ray job submit``).
Ray is imported only once the arguments, ``--out`` and the inputs have passed their checks, so a
mistake there is one line at once, not one after Ray's start-up.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainer_core.config.arg_types import positive_int, split_fraction
from trainer_core.config.cli import exit_on_error
from trainer_core.config.loader import ConfigError
from trainer_core.data.shards import (
    DEFAULT_SHARD_TOKENS,
    DEFAULT_VAL_FRACTION,
    MANIFEST,
    DataError,
    is_shard_dir,
    read_manifest,
    verify_shards,
)
from trainer_core.data.text_sources import (
    DECODE_POLICIES,
    ReadOptions,
    ReadStats,
    discover_inputs,
    sample_texts,
)
from trainer_core.data.tokenizer import BYTE_FILE, HF_CONFIG, HF_FILE, load_tokenizer, train_bpe
from trainer_core.io import storage
from trainer_core.io.output_dir import check_output_dir, replace_when_complete
from trainer_core.io.sigterm import sigterm_raises_exit

BPE_SAMPLE_BYTES = 64 << 20
OWN_FILES = {MANIFEST, HF_FILE, HF_CONFIG, BYTE_FILE}
"""The names this command writes in ``--out``: a shard dir holding any other is not replaced."""
NAMED_AT_MOST = 5
PLAIN_EVERY_S = 10.0
"""Longest gap between progress lines when stdout is no terminal (a log)."""


class HelpFormat(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each flag's default but ``None``: a flag without one
    is required, or its help says what leaving it out does."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormat)
    p.add_argument(
        "--input", action="append", required=True, help="file, dir, quoted glob or URL (repeatable)"
    )
    p.add_argument(
        "--out",
        required=True,
        help="output shard dir: new, empty, or a shard dir holding only what this command writes (replaced whole, once the new one is complete)",
    )
    # one source of the tokenizer: a given one, or a BPE trained here (not both)
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--tokenizer", default="byte", help="'byte', a tokenizer.json, or a dir holding one"
    )
    source.add_argument(
        "--train-bpe",
        type=positive_int,
        metavar="VOCAB",
        help="train a byte-level BPE of this vocab size here",
    )
    p.add_argument(
        "--bpe-sample-mb",
        type=positive_int,
        default=BPE_SAMPLE_BYTES >> 20,
        help="text sampled for --train-bpe",
    )
    p.add_argument("--text-field", default="text", help="JSONL field holding the text")
    p.add_argument("--parquet-column", default="text", help="parquet column holding the text")
    p.add_argument(
        "--shard-tokens",
        type=positive_int,
        default=DEFAULT_SHARD_TOKENS,
        help="tokens per output file",
    )
    p.add_argument(
        "--val-fraction",
        type=split_fraction,
        default=DEFAULT_VAL_FRACTION,
        help="share of documents for validation",
    )
    p.add_argument(
        "--on-decode-error",
        choices=DECODE_POLICIES,
        default="strict",
        help="non-UTF-8 / unreadable input",
    )
    p.add_argument("--num-cpus", type=positive_int, help="CPUs of the local Ray (default: all)")
    return p.parse_args(argv)


def check_out(out: str) -> Path:
    """``--out``, checked before any work: a local (or shared file system) dir, as the shards
    are written in place and swapped in by a rename; writable (the swap renames in its parent
    too); and new, empty or a shard dir, the only kind this command replaces, so that it never
    deletes files it did not write."""
    if storage.is_url(out):
        raise ConfigError(
            f"--out: {out} is a URL, but --out must be a local or shared-filesystem dir; build the "
            "shards locally, upload the finished dir, and point data.shards at it"
        )
    target = check_output_dir(out, "--out")
    check_output_dir(target.parent, "--out")
    if target.is_dir() and any(target.iterdir()):
        check_replaceable(target)
    return target


def check_replaceable(target: Path) -> None:
    """Refuse a non-empty ``--out`` unless it is a shard dir (a ``manifest.json`` of the shard
    format, not any file of that name) holding only files this command writes: replacing it
    deletes every file in it."""
    if not (target / MANIFEST).is_file():
        raise ConfigError(
            f"--out: {target} holds files but no {MANIFEST}, and only a shard dir is replaced; "
            "choose a new or empty dir"
        )
    if not is_shard_dir(target):
        raise ConfigError(
            f"--out: {target / MANIFEST} is not a shard manifest, and only a shard dir is "
            "replaced; choose a new or empty dir"
        )
    try:
        manifest = read_manifest(target)
    except DataError as e:
        raise ConfigError(
            f"--out: {target / MANIFEST} is damaged ({e}), so which files of {target} this "
            "command wrote can't be told; delete the dir yourself, or choose another --out"
        ) from None
    ours = OWN_FILES | {f.name for f in manifest.train + manifest.validation}
    foreign = sorted(p.name for p in target.iterdir() if not (p.is_file() and p.name in ours))
    if foreign:
        more = len(foreign) - NAMED_AT_MOST
        names = ", ".join(foreign[:NAMED_AT_MOST]) + (f" and {more} more" if more > 0 else "")
        raise ConfigError(
            f"--out: {target} is a shard dir but also holds {names}, which replacing it would "
            "delete; move them out or choose another --out"
        )


class PlainProgress:
    """``on_file`` for a log (``ray job logs``, a redirect), where a live bar shows nothing: a
    line per tenth of the files or per :data:`PLAIN_EVERY_S` seconds, whichever comes first."""

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic):
        self.total, self.clock = total, clock
        self.every_files = max(total // 10, 1)
        self.files = self.documents = 0
        self.mb = 0.0
        self.start = self.last = clock()

    def __call__(self, stats: ReadStats) -> None:
        self.files += 1
        self.documents += stats.documents
        self.mb += stats.text_bytes / 1e6
        now = self.clock()
        tenth = self.files % self.every_files == 0 or self.files == self.total
        if not tenth and now - self.last < PLAIN_EVERY_S:
            return
        self.last = now
        print(
            f"tokenizing: {self.files}/{self.total} files, {self.mb:.1f} MB, "
            f"{self.documents:,} documents, {now - self.start:.0f} s",
            flush=True,
        )


@contextmanager
def file_progress(total: int) -> Iterator[Callable[[ReadStats], None]]:
    """``on_file`` for :func:`tokenize_to_shards`: a live bar on a terminal, else plain lines."""
    console = Console()
    if not console.is_terminal:
        yield PlainProgress(total)
        return
    columns = (
        TextColumn("tokenizing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("files {task.fields[mb]:.1f} MB"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("files", total=total, mb=0.0)

        def on_file(stats: ReadStats) -> None:
            progress.update(
                task, advance=1, mb=progress.tasks[task].fields["mb"] + stats.text_bytes / 1e6
            )

        yield on_file


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = check_out(args.out)
    opts = ReadOptions(args.text_field, args.parquet_column, args.on_decode_error)
    files = discover_inputs(
        args.input, lambda d: say(f"left out:   {d}: a shard dir (tokens, not text)")
    )
    if args.train_bpe:
        say(
            f"training:   a BPE of vocab {args.train_bpe} on <= {args.bpe_sample_mb} MB of the text"
        )
        tokenizer = train_bpe(sample_texts(files, opts, args.bpe_sample_mb << 20), args.train_bpe)
    else:
        tokenizer = load_tokenizer(args.tokenizer)
    import ray.data

    from trainer_core.ray.runtime import init_ray, submitted_or_local
    from trainer_core.ray.tokenization import tokenize_to_shards

    init_ray(submitted_or_local(), num_cpus=args.num_cpus, dashboard=False)
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ray.data.DataContext.get_current().enable_progress_bars = False
    start = time.perf_counter()
    with sigterm_raises_exit(), replace_when_complete(out) as stage:
        with file_progress(len(files)) as on_file:
            manifest, totals = tokenize_to_shards(
                files,
                tokenizer,
                stage,
                opts,
                val_fraction=args.val_fraction,
                shard_tokens=args.shard_tokens,
                on_file=on_file,
                info={"inputs": args.input},
            )
        tokenizer.save(stage)
        say(f"verifying:  {len(manifest.train) + len(manifest.validation)} shard files")
        verify_shards(stage)
    print_summary(read_manifest(out), totals, time.perf_counter() - start)
    return 0


def print_summary(manifest, totals: ReadStats, seconds: float) -> None:
    mb = totals.text_bytes / 1e6
    t = manifest.tokenizer
    print(
        f"shards:     {manifest.dir} ({len(manifest.train)} train + {len(manifest.validation)} val files, {manifest.dtype})"
    )
    print(f"tokenizer:  {t.kind}, vocab {t.vocab_size}, eos {t.eos_id}, hash {t.content_hash[:12]}")
    print(f"input:      {totals.files} files, {totals.documents} documents, {mb:.2f} MB of text")
    print(
        f"tokens:     {manifest.num_train_tokens:,} train, {manifest.num_val_tokens:,} validation"
    )
    if manifest.val_fraction > 0 and not manifest.validation:
        print(
            f"warning:    no validation documents: {totals.documents} document(s) can't be split, and "
            "evaluation in training needs some; split the corpus into more documents or files"
        )
    print(
        f"not used:   {totals.skipped_files} unreadable files, {totals.skipped_documents} undecodable documents, "
        f"{totals.empty_documents} empty documents; {totals.replaced_documents} documents had bad bytes replaced"
    )
    print(f"speed:      {seconds:.1f} s, {mb / max(seconds, 1e-9):.2f} MB/s")


if __name__ == "__main__":
    exit_on_error(main)
