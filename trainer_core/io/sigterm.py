"""SIGTERM (``ray job stop``, ``kill``) turned into an exception the code already handles.

By default SIGTERM ends a Python process at once, and the handler ``ray.init`` installs (Ray's
C++ one) does too, with a stack: a half-written stage stays behind, or Tune never saves. The
two handlers here make it a ``SystemExit`` (cleanup runs) or a Ctrl+C (Tune saves and the run
ends in its one "--resume" line). Outside the main thread, where no handler can be set, a block
runs unchanged; after it, the previous handler is back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

Handler = Callable[[int, object], None]


@contextmanager
def _handled_by(handler: Handler) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _exit(signum: int, frame: object) -> None:
    # A second SIGTERM must not cut the cleanup this exit runs short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _ctrl_c(signum: int, frame: object) -> None:
    # What a Ctrl+C runs: the SIGINT handler (Tune's, or Python's KeyboardInterrupt), called
    # here rather than by raising SIGINT, which a process can have ignored or blocked from its
    # start (a shell script's `cmd &` ignores it; Ray's own processes block it): the SIGTERM
    # would then do nothing, and `ray job stop` SIGKILLs the driver 3 s later.
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        raise KeyboardInterrupt
    handler(signal.SIGINT, frame)


def sigterm_raises_exit() -> AbstractContextManager[None]:
    """Within the block SIGTERM raises SystemExit (status 143), so cleanup such as
    :func:`~trainer_core.io.output_dir.replace_when_complete`'s runs; a second one is ignored
    until the block ends."""
    return _handled_by(_exit)


def sigterm_as_ctrl_c() -> AbstractContextManager[None]:
    """Within the block SIGTERM runs the SIGINT handler in the main thread, so Tune stops as on
    a Ctrl+C (KeyboardInterrupt where no handler is set). Enter it after ``ray.init``, which
    replaces any handler set before."""
    return _handled_by(_ctrl_c)
