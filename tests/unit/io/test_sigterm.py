"""SIGTERM as a Ctrl+C for Tune's driver (the SystemExit flavour is tested with the stage it
cleans up, in tests/unit/data/test_tokenize_corpus.py)."""

import contextlib
import signal
import threading

import pytest

from trainer_core.io.sigterm import sigterm_as_ctrl_c


@contextlib.contextmanager
def sigint_as(handler, blocked: bool):
    """SIGINT handled by ``handler`` (blocked too if ``blocked``) within the block."""
    previous = signal.signal(signal.SIGINT, handler)
    if blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    "sigint, blocked",
    [
        (signal.default_int_handler, False),
        # A process started with SIGINT ignored (a shell script's `cmd &`) or blocked (Ray's
        # processes): raising SIGINT did nothing, so a SIGTERM did not stop the driver either.
        (signal.SIG_IGN, False),
        (signal.default_int_handler, True),
    ],
    ids=["sigint-default", "sigint-ignored", "sigint-blocked"],
)
def test_sigterm_in_the_block_is_a_ctrl_c_and_the_handler_from_before_is_back(sigint, blocked):
    received = []

    def record(signum, frame):
        received.append(signum)

    previous = signal.signal(signal.SIGTERM, record)
    try:
        with sigint_as(sigint, blocked), pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
            # raise_signal, not os.kill: delivered to this thread before it returns; a kill
            # may land on another thread, whose trip of the handler can come after the next line
            signal.raise_signal(signal.SIGTERM)
            pytest.fail("SIGTERM did not raise KeyboardInterrupt")
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (received, after) == ([], record)


def test_sigterm_in_the_block_runs_the_sigint_handler_tune_set():
    """Tune's ``fit`` sets its own SIGINT handler (stop, save, return): SIGTERM must run it, as
    a Ctrl+C does, not raise past it."""
    calls = []

    def tune_like(signum, frame):
        calls.append(signum)

    with sigint_as(tune_like, blocked=False), sigterm_as_ctrl_c():
        signal.raise_signal(signal.SIGTERM)
    assert calls == [signal.SIGINT]


def test_outside_the_main_thread_the_block_runs_unchanged():
    """No handler can be set there: entering must not raise (Ray runs drivers in threads)."""
    ran = []

    def body():
        with sigterm_as_ctrl_c():
            ran.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert ran == [before]
