"""Shared fixtures: one Ray instance per test session, tiny configs, the cached demo corpus."""

from __future__ import annotations

import os

import pytest

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
