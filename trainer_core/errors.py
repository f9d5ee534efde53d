"""The exceptions entry points print as one line (exit 2) instead of a traceback: the user's
input is wrong, or a run stopped for a reason its message states whole.

Each kind derives from :class:`UserError` where it is defined (``ConfigError``, ``DataError``,
``CheckpointError``, ``NonFiniteLossError``, ``AnalysisError``, :class:`RunFailedError`), so this
module imports nothing and every entry point can catch them all without loading the library.
Warnings a user should read (a checkpoint skipped, shards without checksums) are
:class:`RunWarning`s, which entry points and Ray workers print as one line the same way.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator


class UserError(Exception):
    """An error whose message is all the user needs: printed as one line, never retried on Ray."""


class RunFailedError(UserError, RuntimeError):
    """A run on Ray stopped for good: a non-retriable error, or out of retries. Its checkpoints
    and metrics are kept, so the same command resumes it once the cause is fixed."""


def exception_chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error``, then the exception it was raised from or while handling, and so on: where the
    real cause of a wrapped error is found (a user error under Ray's, a Ctrl+C under torch's)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


class RunWarning(UserWarning):
    """A warning whose message is all the user needs. Python would print it with the library's
    source line that raised it, which the user can do nothing about;
    :func:`print_run_warnings_as_lines` prints it as ``warning: <message>``."""


def print_run_warnings_as_lines() -> None:
    """In this process, format :class:`RunWarning` as one line; other warnings as Python does
    (a third party's warning keeps its location). Called by every entry point and Ray worker."""
    python_format = warnings.formatwarning
    if getattr(python_format, "prints_run_warnings", False):
        return

    def formatwarning(message, category, filename, lineno, line=None) -> str:
        if issubclass(category, RunWarning):
            return f"warning: {message}\n"
        return python_format(message, category, filename, lineno, line)

    formatwarning.prints_run_warnings = True  # type: ignore[attr-defined]
    warnings.formatwarning = formatwarning
