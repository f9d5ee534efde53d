"""Shared fixtures: one Ray instance per test session, tiny configs, the cached demo corpus."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def _start_ray():
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            logging_config=ray.LoggingConfig(log_level="ERROR"),
            runtime_env={"env_vars": {"RAY_DATA_DISABLE_PROGRESS_BARS": "1"}},
        )
    return ray


@pytest.fixture(scope="session")
def _ray_owner():
    """Shuts down at the end of the session whatever Ray the tests left running."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_session(_ray_owner):
    """A local Ray shared by the tests that need one in-process (ray.init costs ~6 s, paid once
    unless a test in between needed the machine to itself)."""
    return _start_ray()


@pytest.fixture()
def no_local_ray(_ray_owner):
    """For tests whose subprocess starts its own Ray: with two Ray instances on one machine, Ray
    Train's placement-group cleaner cannot tell which to query and stopped trials leak CPUs."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def make_shards(tmp_path):
    """Build a small byte-level shard dir from texts, with tiny files, rows and row groups so
    that multi-file and cross-row-group reads happen even on a few KB of text."""
    from trainer_core.shards import DatasetWriter, TokenizerInfo, split_key
    from trainer_core.tokenizer import ByteTokenizer

    def make(
        texts, name="shards", val_fraction=0.2, shard_tokens=700, row_tokens=32, row_group_rows=2
    ):
        tok = ByteTokenizer()
        out = tmp_path / name
        writer = DatasetWriter(
            out,
            TokenizerInfo(**tok.identity()),
            val_fraction,
            shard_tokens,
            row_tokens,
            row_group_rows,
        )
        for text in texts:
            writer.add(tok.encode_arrays([text])[0], split_key(text))
        writer.finish()
        return out

    return make


@pytest.fixture
def random_texts():
    """Deterministic pseudo-text documents for data tests: ``random_texts(n, seed, letters)``."""
    import numpy as np

    def make(n, seed=0, letters="abcdefghijklmnopqrstuvwxyz ", low=40, high=200):
        rng = np.random.default_rng(seed)
        alphabet = np.array(list(letters))
        return ["".join(rng.choice(alphabet, int(rng.integers(low, high)))) for _ in range(n)]

    return make


@pytest.fixture
def run_script(monkeypatch, capsys):
    """Run an entry script in this process as ``python <script> <args>`` would (its ``main``
    under :func:`trainer_core.cli.exit_on_error`): ``(exit code, stdout, stderr)``. Loaded from
    its file, since scripts are not a package and datasets/tokenize.py shadows a stdlib module."""
    from trainer_core.cli import exit_on_error

    def run(script: str, *args: str) -> tuple[int, str, str]:
        path = ROOT / script
        monkeypatch.setattr(sys, "path", list(sys.path))
        monkeypatch.setattr(sys, "argv", [str(path), *args])
        spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with pytest.raises(SystemExit) as done:
            exit_on_error(module.main)
        out = capsys.readouterr()
        return done.value.code, out.out, out.err

    return run
