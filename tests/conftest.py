"""Shared fixtures: one Ray instance per test session, tiny configs, the demo corpus cached in a
session temp dir, a free port, and one harness for the processes a test starts.

Markers: ``ray`` (needs a Ray runtime), ``slow`` (more than a few seconds: every test that starts
Ray, spawns ranks or trains more than a few steps); ``pytest -m "not slow"`` is the fast tier.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from scripts import load_script
from synthetic_experiments import make_ladder, make_sweep

from trainer_core.analysis.bootstrap import WORKERS_ENV
from trainer_core.data.demo_corpus import CACHE_ENV

ROOT = Path(__file__).resolve().parent.parent

ONE_CORE_EACH = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", WORKERS_ENV: "1"}
"""Under ``pytest -n N``: one compute thread per pytest worker and per process it starts, and
the analysis's refits in-process. With two workers on two cores, torch's, OpenBLAS's and
joblib's default of one per core put four or more busy threads on two cores, and spin-waiting
threads then slow every test that shares the machine (benchmarks/RESULTS.md, "Suite time")."""


def pytest_configure(config):
    """Set :data:`ONE_CORE_EACH` in the xdist controller, before it starts its workers: they
    inherit it from their start. Set in a worker's conftest it came too late for OpenBLAS,
    which numpy (imported with the helpers above) had started with a thread per core."""
    if getattr(config.option, "numprocesses", None):
        for name, value in ONE_CORE_EACH.items():
            os.environ.setdefault(name, value)


os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
# Ray reads its auth mode once per process: every Ray this process starts or joins (the local
# one, the multi-node cluster) runs without tokens, so none sees another's mode. Subprocesses
# get Ray's default instead (see Processes), as a user's commands do.
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


RAY_FIXTURES = frozenset({"ray_session", "s3_ray", "no_local_ray", "multinode"})
"""The fixtures that start, join or stop a Ray in this process or for a subprocess."""

RAY_TEST_FILES = frozenset(
    {
        "tests/e2e/test_init_ray.py",
        "tests/e2e/test_interrupt.py",
        "tests/e2e/test_job_submit.py",
        "tests/e2e/test_lr_sweep.py",
        "tests/e2e/test_multinode.py",
        "tests/e2e/test_object_storage_on_ray.py",
        "tests/e2e/test_ray_data.py",
        "tests/e2e/test_ray_train.py",
        "tests/e2e/test_train_interrupt.py",
        "tests/e2e/test_trial_runner.py",
        "tests/unit/analysis/test_load.py",
    }
)
"""The test files that hold every test needing a Ray (marked ``ray`` or using one of
:data:`RAY_FIXTURES`). Under ``make test`` (``pytest -n 2``) they run in order on one worker, one
Ray at a time, while the other worker takes the rest: two Rays at once would overload two cores,
and a single-process test leaves the second core idle (benchmarks/RESULTS.md, "Suite time")."""


if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # pytest started in the background of a script (`bash .ci/run > log &`) inherits an ignored
    # SIGINT, and so would every run the tests start: the Ctrl+C tests' runs then trained on to
    # exit 0 (three local CI runs of stop 48). A terminal's pytest has Python's default.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def signal_handlers_restored():
    """Each test ends with the SIGINT and SIGTERM handlers it started with, and starts with
    neither blocked (a child inherits the mask): Ray Train's and Tune's ``fit`` set their own
    handlers in the main thread and leave them, for whatever test runs next on that worker."""
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)  # a mask is inherited by children
    saved = {sig: signal.getsignal(sig) for sig in signals}
    yield
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


def pytest_collection_modifyitems(config, items):
    """Marks ``ray`` every test that needs a Ray, and stops the run if one sits outside
    :data:`RAY_TEST_FILES` (the scheduler below would run it beside the other Ray tests)."""
    for item in items:
        if item.get_closest_marker("ray") or RAY_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.ray)
            path = item.nodeid.split("::", 1)[0]
            if path not in RAY_TEST_FILES:
                raise pytest.UsageError(
                    f"{item.nodeid} needs a Ray but {path} is not in RAY_TEST_FILES "
                    "(tests/conftest.py): add it there, so it runs with the other Ray tests"
                )


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler: the tests of :data:`RAY_TEST_FILES` are one unit of work (one
    worker, in order, handed out first since it is the largest), every other test its own."""
    from xdist.scheduler import LoadScopeScheduling

    class RayTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "ray" if nodeid.split("::", 1)[0] in RAY_TEST_FILES else nodeid

    return RayTestsTogether(config, log)


@pytest.fixture(scope="session", autouse=True)
def private_caches(tmp_path_factory):
    """The demo corpus (tokenized in about a second) and W&B's cache, config and data dirs go to
    a session temp dir, never to the user's home or the repo. Set before any Ray starts, so Ray's
    workers and every subprocess inherit them."""
    root = tmp_path_factory.mktemp("caches")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(root / "rayladder"))
        for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            patch.setenv(name, str(root / name.lower()))
        yield root


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """``free_port()``: a TCP port on 127.0.0.1 that nothing listens on right now."""

    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return pick


TINY_RUN = (
    "--model.n_layers=2",
    "--data.seq_len=64",
    "--trainer.global_batch_size=512",
    "--trainer.max_steps=20",
    "--trainer.log_interval=5",
    "--trainer.eval_interval=10",
    "--trainer.eval_batches=2",
    "--trainer.progress=false",
    "--checkpoint.save_interval_minutes=null",
)
"""A 2-layer model on 64-token sequences, 8 a step, for 20 steps on the demo corpus: seconds on
a CPU. Logs every 5 steps, evaluates every 10."""


@pytest.fixture(scope="session")
def tiny_args() -> Callable[..., list[str]]:
    """``tiny_args(run_dir, *overrides)``: the command-line arguments of the tiny run in
    ``run_dir``; later overrides win."""

    def args(run_dir: Path, *overrides: str) -> list[str]:
        return [f"--trainer.run_dir={run_dir}", *TINY_RUN, *overrides]

    return args


@pytest.fixture(scope="session")
def tiny_config(tiny_args):
    """``tiny_config(run_dir, *overrides, cls=TrainConfig)``: the tiny run as a config object
    (``cls=RayTrainConfig`` for one on Ray Train)."""
    from trainer_core.config.loader import load_config
    from trainer_core.config.sections import TrainConfig

    def make(run_dir: Path, *overrides: str, cls: type = TrainConfig):
        return load_config(cls, None, tiny_args(run_dir, *overrides))

    return make


TINY_EXPERIMENT = {
    "seq_len": 64,
    "batch": {"coef": 20480.0},
    "run": {
        "trainer": {"eval_batches": 2},
        "checkpoint": {"save_interval_minutes": None},
    },
    "ray": {"cpus_per_worker": 0.8, "address": "local", "reader": "worker"},
}
"""What every tiny ladder / LR sweep shares: 64-token sequences, a batch formula that gives the
1M and 3M sizes a few sequences a step, one worker of 0.8 CPU a run (two runs at once on 2 CPUs)
that reads its batches itself (no Ray Data processes: each trial starts a few seconds sooner;
Ray Data's path is tested in test_ray_train.py, test_ray_data.py and test_multinode.py)."""


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture
def tiny_experiment(tmp_path) -> Callable[..., Path]:
    """``tiny_experiment(name, **sections)``: writes ``<tmp_path>/<name>.yaml``, a tiny ladder or
    LR sweep (:data:`TINY_EXPERIMENT` with ``sections`` merged in, ``dir`` under ``tmp_path``),
    and returns its path."""

    def write(name: str, **sections) -> Path:
        data = _merge({"name": name, "dir": str(tmp_path / name), **TINY_EXPERIMENT}, sections)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


class Processes:
    """Starts processes as a shell in the repo root would, with the session's environment minus
    ``RAY_ADDRESS`` (so each starts its own local Ray) and ``RAY_AUTH_MODE`` (so it has Ray's
    default, token auth, unless a test sets it), each in a session of its own. It kills
    only what it started: a process group at a timeout, and at teardown whatever is still running.
    """

    def __init__(self):
        self.env = {
            k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")
        }
        self.env["PYTHONUNBUFFERED"] = "1"
        self.started: list[subprocess.Popen] = []

    def _popen(self, argv, env, cwd=ROOT, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            cwd=cwd,
            env={**self.env, **(env or {})},
            start_new_session=True,
            text=True,
            **kw,
        )
        self.started.append(proc)
        return proc

    def run(self, *argv, timeout: float = 300, env: dict | None = None, cwd: Path = ROOT):
        """Run ``argv`` to the end (in ``cwd``): a CompletedProcess with its stdout and stderr."""
        proc = self._popen(argv, env, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def python(self, *args, timeout: float = 300, env: dict | None = None):
        """``python *args`` in a fresh interpreter (a script path is relative to the repo root)."""
        return self.run(sys.executable, *args, timeout=timeout, env=env)

    def start(self, *argv, log: Path, env: dict | None = None) -> subprocess.Popen:
        """Start ``argv`` in the background, its stdout and stderr into ``log``."""
        with open(log, "w") as out:
            return self._popen(argv, env, stdout=out, stderr=subprocess.STDOUT)

    def wait_until(self, condition, proc: subprocess.Popen, log: Path, timeout: float) -> None:
        """Wait for ``condition()`` (a state the run reaches and keeps, e.g. a file a hook
        wrote); fail at once if ``proc`` exits first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if proc.poll() is not None:
                pytest.fail(f"exited early ({proc.returncode}):\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"not reached in {timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 180) -> None:
        """Signal the process group of ``proc`` (one this harness started) and reap it. The
        wait is long: a Ctrl+C'd run took over 60 s to exit once on a loaded 2-core machine
        (alone, a second or so); a process that never exits still fails the test."""
        assert proc in self.started, "only processes this harness started are signalled"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                self.kill(proc)


@pytest.fixture
def processes():
    """The process harness (:class:`Processes`) of one test."""
    harness = Processes()
    yield harness
    harness.close()


@pytest.fixture
def spawn_ranks(free_port):
    """``spawn_ranks(fn, world, *args, timeout=240)``: runs ``fn(rank, world, port, *args)`` in
    ``world`` fresh processes (``fn`` at a test module's top level; ``port`` free for the
    process group's rendezvous), each ending as a torchrun rank does (``ranks.run_rank``), and
    returns when all succeeded. A rank's exception fails the test with its traceback; ranks
    still running at the timeout are killed, and the test fails.

    The ranks are forked from a server process that imported torch and the parallel and
    checkpoint code once (:data:`RANK_PRELOAD`), so a rank starts in a fraction of a second
    instead of importing torch anew; each takes this process's environment as it is now."""
    import torch.multiprocessing as mp

    mp.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)

    def spawn(fn, world: int, *args, timeout: float = 240) -> None:
        from ranks import run_rank

        ctx = mp.start_processes(
            run_rank,
            args=(dict(os.environ), fn, world, free_port(), *args),
            nprocs=world,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for process in ctx.processes:
                    process.kill()
                pytest.fail(f"{world} ranks of {fn.__name__}{args} did not finish in {timeout} s")

    return spawn


RANK_PRELOAD = ["ranks", "trainer_core.parallel.wrap", "trainer_core.checkpoint.checkpointer"]
"""What the rank server imports before it forks ranks: torch and the modules most ranks run. A
forked rank starts with them imported, as torch's DataLoader workers do on Linux; the rest (the
test's module, pyarrow where it reads shards) it imports itself."""


def _start_ray():
    """The tests' Ray starts the way every entry point's does (``init_ray``), on 2 CPUs."""
    import ray

    from trainer_core.ray.runtime import init_ray

    init_ray("local", num_cpus=2, dashboard=False)
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
    """For tests whose subprocess starts its own Ray: it gets the 2 cores to itself instead of
    sharing them with the session's Ray (whose workers and Ray Data stats actor stay up). Two Rays
    on one machine work (test_ray_train.py runs one beside a ``ray start`` cluster); this is for
    the subprocess's speed and timings."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def make_shards(tmp_path):
    """Build a small byte-level shard dir from texts, with tiny files, rows and row groups so
    that multi-file and cross-row-group reads happen even on a few KB of text."""
    from trainer_core.data.shards import DatasetWriter, TokenizerInfo, split_key
    from trainer_core.data.tokenizer import ByteTokenizer

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
    under :func:`trainer_core.config.cli.exit_on_error`): ``(exit code, stdout, stderr)``. Loaded from
    its file, since scripts are not a package."""
    from trainer_core.config.cli import exit_on_error

    def run(script: str, *args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "path", list(sys.path))
        monkeypatch.setattr(sys, "argv", [str(ROOT / script), *args])
        module = load_script(script)
        with pytest.raises(SystemExit) as done:
            exit_on_error(module.main)
        out = capsys.readouterr()
        return done.value.code, out.out, out.err

    return run


@pytest.fixture(scope="session")
def ladder_dir(tmp_path_factory) -> Path:
    return make_ladder(tmp_path_factory.mktemp("ladder"))


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory) -> Path:
    return make_sweep(tmp_path_factory.mktemp("sweep"))


class Records(logging.Handler):
    """Keeps every record it is handed, for a test to read."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def ray_log():
    """The records Ray's console handlers get during the test: they write to the stderr of the
    session's start, out of capfd's reach. "ray" and below, and Ray Data's ("ray.data" does not
    propagate to "ray"); as those handlers do, records marked ``hide`` are skipped."""
    handler = Records()
    handler.addFilter(lambda record: not getattr(record, "hide", False))
    loggers = [logging.getLogger(name) for name in ("ray", "ray.data")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler.records
    for logger in loggers:
        logger.removeHandler(handler)
