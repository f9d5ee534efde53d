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
    And twelve actors that hold no CPU, on one CPU, start without Ray's warning of more processes
    than the node's startup concurrency (a trial's driver, controller and cleaner are such
    actors: two trials at a time on 2 cores drew it)."""
    code = (
        "import logging, logging.config, time, ray\n"
        "from trainer_core.ray.runtime import init_ray\n"
        "init_ray('local', num_cpus=1)\n"
        "@ray.remote(num_cpus=0)\n"
        "def passes(name, level):\n"
        "    config = {'version': 1, 'disable_existing_loggers': False,\n"
        "              'loggers': {'ray.train': {'level': 'DEBUG'}}}\n"
        "    logging.config.dictConfig(config)\n"
        "    record = logging.LogRecord(name, level, 'x.py', 0, 'msg', None, None)\n"
        "    return logging.getLogger(name).filter(record)\n"
        "name = 'ray.train.v2._internal.callbacks.backend_setup'\n"
        "print(ray.get([passes.remote(name, logging.WARNING), passes.remote(name, logging.ERROR)]))\n"
        "@ray.remote(num_cpus=0)\n"
        "class Idle:\n"
        "    def ping(self):\n"
        "        return 1\n"
        "actors = [Idle.remote() for _ in range(12)]\n"
        "assert sum(ray.get([a.ping.remote() for a in actors])) == 12\n"
        "time.sleep(3)  # Ray's warnings reach the driver's stdout by a thread of their own\n"
    )
    out = processes.python("-c", code, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[False, True]"
    assert "startup concurrency" not in out.stdout + out.stderr
