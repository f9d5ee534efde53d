"""Runs a Ctrl+C cut off, recorded ``interrupted`` once their metrics stop growing: all of them
waited on together, under one deadline, by their metrics' size, each read whole once."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import fsspec
import pytest

from trainer_core.io import run_dir as run_dir_module
from trainer_core.io import storage
from trainer_core.io.run_dir import RunInfo, metrics_path, read_run_json, write_run_json
from trainer_core.ray import tune_run
from trainer_core.ray.tune_run import TrialSpec, record_interrupts

QUIET_S, LIMIT_S, POLL_S = 1.0, 10.0, 0.1
"""What record_interrupts waits for: metrics unchanged this long, at most this long in all."""


class FakeTime:
    """``time`` as tune_run uses it, on a clock that only ``sleep`` moves; each sleep then
    calls ``on_sleep`` (a run's workers logging meanwhile)."""

    def __init__(self, on_sleep=lambda now: None):
        self.now = 0.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        self.on_sleep(self.now)


def started_run(run_dir, steps: int) -> TrialSpec:
    """A run "running" at step 0 (as its start wrote it) that logged ``steps`` steps."""
    storage.makedirs(run_dir)
    info = RunInfo("run", 1, 1, 1e-3, 1, 1, total_steps=100, size=storage.name(run_dir))
    write_run_json(run_dir, info, "running", last_step=0)
    if steps:
        storage.write_atomic(metrics_path(run_dir), b"".join(line(s) for s in range(1, steps + 1)))
    config = SimpleNamespace(trainer=SimpleNamespace(run_dir=run_dir))
    return TrialSpec(storage.name(run_dir), config)


def line(step: int) -> bytes:
    return (json.dumps({"step": step, "loss": 1.0}) + "\n").encode()


def log_step(run_dir, step: int) -> None:
    """Append a step's line as a run does: locally in place, on object storage whole."""
    path = metrics_path(run_dir)
    old = storage.read_bytes(path) if storage.is_file(path) else b""
    storage.write_atomic(path, old + line(step))


def count_parses(monkeypatch) -> Counter:
    """Counts of whole reads of each run's metrics, by run name, as they happen."""
    parsed = Counter()
    parse = run_dir_module.metric_lines

    def counting(path):
        parsed[storage.name(storage.parent(path))] += 1
        return parse(path)

    monkeypatch.setattr(run_dir_module, "metric_lines", counting)
    return parsed


def recorded(run_dir) -> tuple[str, int]:
    record = read_run_json(run_dir)
    return record["status"], record["last_step"]


def test_still_runs_are_waited_on_together_for_one_quiet_period(tmp_path, monkeypatch):
    """Three runs whose metrics no longer grow: one quiet period in all, not one per run (it
    was one after the other: K runs took K quiet periods, and up to K times the limit)."""
    specs = [started_run(tmp_path / name, steps) for name, steps in [("a", 5), ("b", 7), ("c", 0)]]
    clock = FakeTime()
    monkeypatch.setattr(tune_run, "time", clock)

    record_interrupts(specs, {"a", "b", "c"})

    assert QUIET_S <= clock.now <= QUIET_S + 2 * POLL_S, clock.now
    assert clock.sleeps <= round(QUIET_S / POLL_S) + 1, clock.sleeps
    assert [recorded(tmp_path / n) for n in "abc"] == [
        ("interrupted", 5),
        ("interrupted", 7),
        ("interrupted", 0),
    ]


def test_the_metrics_are_parsed_once_per_run_not_once_per_look(tmp_path, monkeypatch):
    """Watching a run's metrics is a size check; the whole file (one GET on object storage) is
    read and parsed once per run, to record its last step."""
    specs = [started_run(tmp_path / name, 4) for name in ("a", "b")]
    grown = {"a": 4, "b": 4}

    def workers_log(now: float) -> None:  # a's workers log 2 more steps after fit returned
        if now < 0.25:
            grown["a"] += 1
            log_step(tmp_path / "a", grown["a"])

    parsed = count_parses(monkeypatch)
    monkeypatch.setattr(tune_run, "time", FakeTime(workers_log))

    record_interrupts(specs, {"a", "b"})

    assert parsed == {"a": 1, "b": 1}
    assert recorded(tmp_path / "a") == ("interrupted", 6)
    assert recorded(tmp_path / "b") == ("interrupted", 4)


def test_runs_still_logging_at_the_deadline_are_recorded_at_their_last_step_then(
    tmp_path, monkeypatch
):
    """Two runs whose workers never stop logging: the wait ends at the one deadline (it was
    one deadline per run, after the other's), and each run is recorded at the last step its
    metrics held by then; a run cut off but not waited on is still recorded."""
    names = ("a", "b")
    specs = [started_run(tmp_path / name, 1) for name in names]
    steps = {name: 1 for name in names}

    def workers_log(now: float) -> None:
        for name in names:
            steps[name] += 1
            log_step(tmp_path / name, steps[name])

    clock = FakeTime(workers_log)
    monkeypatch.setattr(tune_run, "time", clock)

    record_interrupts(specs, set(names))

    assert LIMIT_S <= clock.now <= LIMIT_S + 2 * POLL_S, clock.now
    assert steps["a"] > 1 + LIMIT_S / POLL_S - 2  # logged on every look until the deadline
    assert [recorded(tmp_path / n) for n in names] == [("interrupted", steps[n]) for n in names]


def test_runs_on_object_storage_are_watched_by_size_and_one_not_cut_off_is_left(
    tmp_path, monkeypatch
):
    """Run dirs at URLs (an fsspec memory store standing in for S3): a run with no metrics yet
    and one whose metrics grow for a while are waited on together until the latter is still;
    a run this interrupt did not cut off is neither waited on nor recorded."""
    url = f"memory://bucket/{tmp_path.name}"
    fs = fsspec.filesystem("memory")
    try:
        grows, empty, other = (f"{url}/{n}" for n in ("grows", "empty", "other"))
        specs = [started_run(grows, 3), started_run(empty, 0), started_run(other, 2)]
        steps = {"grows": 3}

        def workers_log(now: float) -> None:  # 5 more steps, the last at 0.5 s
            if now < 0.55:
                steps["grows"] += 1
                log_step(grows, steps["grows"])

        parsed = count_parses(monkeypatch)
        clock = FakeTime(workers_log)
        monkeypatch.setattr(tune_run, "time", clock)

        record_interrupts(specs, {"grows", "empty"})

        assert steps["grows"] == 8
        assert 0.5 + QUIET_S <= clock.now <= 0.5 + QUIET_S + 2 * POLL_S, clock.now
        assert parsed == {"grows": 1, "empty": 1}
        assert recorded(grows) == ("interrupted", 8)
        assert recorded(empty) == ("interrupted", 0)
        assert recorded(other) == ("running", 0)
    finally:
        fs.rm(url, recursive=True)


@pytest.mark.parametrize("cut_off", [set(), {"elsewhere"}])
def test_nothing_cut_off_here_waits_for_nothing(tmp_path, monkeypatch, cut_off):
    specs = [started_run(tmp_path / "a", 3)]
    clock = FakeTime()
    monkeypatch.setattr(tune_run, "time", clock)

    record_interrupts(specs, cut_off)

    assert clock.sleeps == 0
    assert recorded(tmp_path / "a") == ("running", 0)
