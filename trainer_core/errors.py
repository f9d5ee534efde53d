"""The exceptions entry points print as one line (exit 2) instead of a traceback: the user's
input is wrong, or a run stopped for a reason its message states whole.

Each kind derives from :class:`UserError` where it is defined (``ConfigError``, ``DataError``,
``CheckpointError``, ``NonFiniteLossError``, ``AnalysisError``, :class:`RunFailedError`), so this
module imports nothing and every entry point can catch them all without loading the library.
"""

from __future__ import annotations


class UserError(Exception):
    """An error whose message is all the user needs: printed as one line, never retried on Ray."""


class RunFailedError(UserError, RuntimeError):
    """A run on Ray stopped for good: a non-retriable error, or out of retries. Its checkpoints
    and metrics are kept, so the same command resumes it once the cause is fixed."""
