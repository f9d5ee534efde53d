"""Process-group setup that works the same under torchrun, Ray Train and a single process.

Ray Train's TorchTrainer creates the default process group before our code runs; torchrun only
sets env vars; a plain ``python`` run has neither and needs no group at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def init_distributed(device_type: str) -> DistInfo:
    """Join (or create) the default process group: gloo on CPU, NCCL on CUDA."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", 1)) > 1:
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return DistInfo(rank, world, local_rank, device)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def teardown() -> None:
    """Destroy a process group we created (Ray Train tears down its own)."""
    if (
        dist.is_initialized()
        and "RAY_TRAIN_WORKER" not in os.environ
        and "TORCHELASTIC_RUN_ID" in os.environ
    ):
        dist.destroy_process_group()
