"""How many processes the refits use: the cores by default, RAYLADDER_ANALYSIS_WORKERS if set."""

from __future__ import annotations

import os

import numpy as np
import pytest

from trainer_core.analysis import AnalysisError
from trainer_core.analysis.bootstrap import WORKERS_ENV, fit_workers, parallel_map


def pid_of(_row: np.ndarray) -> int:
    return os.getpid()


def test_one_worker_keeps_the_refits_in_this_process(monkeypatch):
    """On a machine whose cores are busy (two pytest workers on two cores), a pool of one
    process per core made the analysis tests slower, not faster."""
    monkeypatch.setenv(WORKERS_ENV, "1")
    assert set(parallel_map(pid_of, np.zeros((16, 1)))) == {os.getpid()}


@pytest.mark.parametrize("given", ["0", "two", "-1"])
def test_a_bad_worker_count_is_refused_naming_the_variable(monkeypatch, given):
    monkeypatch.setenv(WORKERS_ENV, given)
    with pytest.raises(AnalysisError) as e:
        fit_workers()
    assert str(e.value) == f"{WORKERS_ENV}={given!r}: give a whole number of processes, >= 1"


def test_unset_it_is_the_cores_at_most_eight(monkeypatch):
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert fit_workers() == min(len(os.sched_getaffinity(0)), 8)
