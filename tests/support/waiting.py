"""Waiting, in tests, for what processes they started do: a state reached, a process gone."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for(condition, timeout: float, poll: float = 0.1) -> None:
    """Return once ``condition()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout} s"
        time.sleep(poll)


def alive(pid: int) -> bool:
    """Running (a zombie left for a reaper that never comes counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
