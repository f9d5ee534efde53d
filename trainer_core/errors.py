"""The exceptions that mean "the user's input is wrong": entry points print them in one line."""

from __future__ import annotations

from trainer_core.checkpoint import CheckpointError
from trainer_core.configio import ConfigError
from trainer_core.shards import DataError
from trainer_core.trainer import NonFiniteLossError

USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    DataError,
    CheckpointError,
    NonFiniteLossError,
)
