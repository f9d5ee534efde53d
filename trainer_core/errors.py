"""The exceptions entry points print as one line (exit 2) instead of a traceback: the user's
input is wrong, or a run stopped for a reason its message states whole."""

from __future__ import annotations

import sys

from trainer_core.checkpoint import CheckpointError
from trainer_core.configio import ConfigError
from trainer_core.shards import DataError
from trainer_core.trainer import NonFiniteLossError


class RunFailedError(RuntimeError):
    """A run on Ray stopped for good: a non-retriable error, or out of retries. Its checkpoints
    and metrics are kept, so the same command resumes it once the cause is fixed."""


USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    DataError,
    CheckpointError,
    NonFiniteLossError,
    RunFailedError,
)


def is_user_error(error: BaseException) -> bool:
    """One of :data:`USER_ERRORS`, or an analysis error. That one is looked up only once analysis
    was imported (else it cannot have been raised), so no entry point pays for loading pandas."""
    analysis = sys.modules.get("trainer_core.analysis.load")
    extra = (analysis.AnalysisError,) if analysis is not None else ()
    return isinstance(error, (*USER_ERRORS, *extra))
