"""The built-in demo corpus: this Python's own standard library source, tokenized once and cached.

Every machine with Python has it, nothing is downloaded, and ~11 MB of code is enough to train
the demo ladder's small models. Test suites, site-packages and ``__pycache__`` are left out;
files are taken in sorted path order up to :data:`DEMO_MAX_BYTES`, so the corpus depends only
on the Python installation. Tokenization runs in-process (no Ray): it takes a second or two.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

from trainer_core.data.shards import MANIFEST
from trainer_core.data.text_sources import TEXT, InputFile, ReadOptions, write_shards
from trainer_core.data.tokenizer import Tokenizer, load_tokenizer

CACHE_ENV = "RAYLADDER_CACHE"
DEMO_MAX_BYTES = 48 * 1024 * 1024
"""Cap on the corpus size (sorted-path prefix) so tokenizing stays fast on any Python version."""
DEMO_SHARD_TOKENS = 1 << 22
"""Several files even for this small corpus, so multi-file code paths are always exercised."""
EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)
CORPUS_VERSION = "3"
"""Bumped when the shard format or the reading of files changes (2: parquet page checksums; 3: a
UTF-8 BOM is not text), so old caches are rebuilt."""
DEMO_READ = ReadOptions(on_decode_error="replace")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def demo_files(root: Path | None = None, max_bytes: int = DEMO_MAX_BYTES) -> list[Path]:
    """The demo corpus's files, sorted by path relative to ``root``, capped at ``max_bytes``."""
    root = root or stdlib_root()
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                found.append((path.relative_to(root).as_posix(), path))
    files, total = [], 0
    for _, path in sorted(found):
        total += path.stat().st_size
        if total > max_bytes:
            break
        files.append(path)
    return files


def corpus_fingerprint(files: list[Path], root: Path) -> str:
    """Changes when the file set or a file's size changes (e.g. another Python version)."""
    h = hashlib.sha256(CORPUS_VERSION.encode())
    for path in files:
        h.update(f"{path.relative_to(root).as_posix()}:{path.stat().st_size}\n".encode())
    return h.hexdigest()


def cache_root(cache_dir: str | Path | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rayladder"


def demo_shards(cache_dir: str | Path | None = None, tokenizer: str | Tokenizer = "byte") -> Path:
    """Shards of the demo corpus under ``<cache>/demo-<tokenizer hash>-<corpus hash>``.

    ``cache`` is ``cache_dir``, else ``$RAYLADDER_CACHE``, else ``~/.cache/rayladder``. Built in a
    temp dir and renamed into place, so concurrent callers (Ray workers, test processes) never
    see a half-written dir; a later call returns the existing one at once.
    """
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    root = stdlib_root()
    files = demo_files(root)
    final = (
        cache_root(cache_dir)
        / f"demo-{tok.content_hash[:12]}-{corpus_fingerprint(files, root)[:8]}"
    )
    if (final / MANIFEST).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-tmp-", dir=final.parent))
    tmp.chmod(0o755)
    try:
        inputs = [InputFile(str(p), TEXT, None, p.stat().st_size) for p in files]
        info = {"corpus": "python-stdlib", "root": str(root)}
        write_shards(inputs, tok, tmp, DEMO_READ, shard_tokens=DEMO_SHARD_TOKENS, info=info)
        tok.save(tmp)
        if final.exists() and not (final / MANIFEST).is_file():
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
