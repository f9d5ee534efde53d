"""What a test's spawned rank process needs to join a gloo process group (see ``spawn_ranks``)."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from trainer_core.parallel.process_group import exit_rank


def join_as_rank(rank: int, world: int, port: int) -> None:
    """Set the variables ``torchrun`` would set for ``rank`` of ``world`` (rendezvous on
    127.0.0.1:``port``), with one intra-op thread: the ranks share the cores."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)


def run_rank(rank: int, env: dict[str, str], fn: Callable[..., None], *args) -> None:
    """``fn(rank, *args)`` with the environment ``env`` (the test's, when it started the ranks),
    then the rank's process ends as a torchrun rank's does
    (:func:`~trainer_core.parallel.process_group.exit_rank`); an exception still fails it."""
    os.environ.clear()
    os.environ.update(env)
    fn(rank, *args)
    exit_rank(0)
