"""What ``init_ray`` sets up in every Ray worker process. Its own file, named to be collected
before the tests that share an in-process Ray: its subprocess starts a Ray of its own
(``no_local_ray``), which would otherwise stop theirs between two of them."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_every_ray_worker_process_starts_with_ray_chatter_turned_down(no_local_ray, processes):
    """init_ray's setup hook runs in each worker process, Train's controller included, so the
    traceback Ray Train logs when early stopping kills a trial never reaches the user, even after
    Ray Train configures its loggers (as it does, with dictConfig, when a controller starts).
    And the Ray it starts may start 16 Python processes at once on one CPU, as its workers'
    environment shows (Ray's default is the CPU count, with a warning once four times that many
    are up: a trial's driver, Ray Train controller and cleaner hold no CPU, and two trials at a
    time on 2 cores drew it; measured with twelve idle actors on one CPU, benchmarks/RESULTS.md
    stop 51)."""
    code = (
        "import logging, logging.config, os, ray\n"
        "from trainer_core.ray.runtime import STARTUP_CONCURRENCY, init_ray\n"
        "init_ray('local', num_cpus=1)\n"
        "@ray.remote(num_cpus=0)\n"
        "def passes(name, level):\n"
        "    config = {'version': 1, 'disable_existing_loggers': False,\n"
        "              'loggers': {'ray.train': {'level': 'DEBUG'}}}\n"
        "    logging.config.dictConfig(config)\n"
        "    record = logging.LogRecord(name, level, 'x.py', 0, 'msg', None, None)\n"
        "    return logging.getLogger(name).filter(record)\n"
        "@ray.remote(num_cpus=0)\n"
        "def startup_concurrency():\n"
        "    return os.environ.get(STARTUP_CONCURRENCY)\n"
        "name = 'ray.train.v2._internal.callbacks.backend_setup'\n"
        "print(ray.get(startup_concurrency.remote()))\n"
        "print(ray.get([passes.remote(name, logging.WARNING), passes.remote(name, logging.ERROR)]))\n"
    )
    out = processes.python("-c", code, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["16", "[False, True]"]
