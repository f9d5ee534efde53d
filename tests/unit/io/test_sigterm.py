"""SIGTERM as a Ctrl+C for Tune's driver (the SystemExit flavour is tested with the stage it
cleans up, in tests/unit/data/test_tokenize_corpus.py)."""

import signal
import threading

import pytest

from trainer_core.io.sigterm import sigterm_as_ctrl_c


def test_sigterm_in_the_block_is_a_ctrl_c_and_the_handler_from_before_is_back():
    received = []

    def record(signum, frame):
        received.append(signum)

    previous = signal.signal(signal.SIGTERM, record)
    try:
        with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
            # raise_signal, not os.kill: delivered to this thread before it returns; a kill may
            # land on another thread, whose trip of the handler can come after the next line
            signal.raise_signal(signal.SIGTERM)
            pytest.fail("SIGTERM did not raise KeyboardInterrupt")
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (received, after) == ([], record)


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
