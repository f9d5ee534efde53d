"""SIGTERM (``ray job stop``, ``kill``) on a Tune driver, handled as the Ctrl+C it stands for."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM raises SIGINT in the main thread, so Tune stops as on a Ctrl+C:
    it saves its state, and the run ends in the one "interrupted ... --resume" line. Without
    this, the handler ``ray.init`` leaves (Ray's C++ one) kills the driver mid-write, with a stack
    and no word of ``--resume``. Enter it after ``ray.init``, which replaces any handler set
    before. Outside the main thread, where no handler can be set, the block runs unchanged; after
    it, the previous handler is back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _raise_sigint(signum: int, frame: object) -> None:
    signal.raise_signal(signal.SIGINT)
