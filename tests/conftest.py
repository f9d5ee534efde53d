"""Shared fixtures: one Ray instance per test session, tiny configs, the cached demo corpus."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray shared by every test that needs one (ray.init costs ~6 s)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            logging_config=ray.LoggingConfig(log_level="ERROR"),
            runtime_env={"env_vars": {"RAY_DATA_DISABLE_PROGRESS_BARS": "1"}},
        )
    yield ray
    if started:
        ray.shutdown()
