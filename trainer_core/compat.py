"""The torch calls whose arguments differ between the releases rayladder accepts (2.6 on).

A GPU cluster brings its own CUDA build of torch, often older than the one pinned for
development. Each function here takes the newer API where this torch has it and otherwise gets
the same result the older release's way (or, where there is none, says so in one line). One
module, so that raising the floor deletes code here and nowhere else.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from trainer_core.parallel.process_group import is_distributed

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Placement

T = TypeVar("T")


@functools.cache
def takes(fn: Callable[..., Any], argument: str) -> bool:
    """Whether this torch's ``fn`` has a parameter named ``argument``."""
    return argument in inspect.signature(fn).parameters


def dcp_runs_collectives() -> bool:
    """Whether DCP's save and load here talk to a process group: with more than one rank, and
    before torch 2.7 with a group of one too (``no_dist``, which skips it, came in 2.7)."""
    import torch.distributed.checkpoint as dcp

    if is_distributed():
        return True
    return not takes(dcp.save, "no_dist") and dist.is_available() and dist.is_initialized()


def dcp_call(fn: Callable[..., T], state: dict[str, Any], **kwargs: Any) -> T:
    """``fn(state, **kwargs)`` for DCP's ``save``, ``async_save`` or ``load``, as one process
    where no group of more than one rank exists: ``no_dist`` where torch has it; before, DCP
    finds no group by itself and warns at every call that it assumes one process, which is
    what is meant here, so that warning is dropped."""
    if takes(fn, "no_dist"):
        return fn(state, no_dist=not is_distributed(), **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to")
        return fn(state, **kwargs)


def dcp_async_save(state: dict[str, Any], **kwargs: Any) -> Any:
    """DCP's ``async_save`` (through :func:`dcp_call`), the state copied before it returns.
    From 2.7 its stager copies; 2.6 only moves tensors to the CPU, which for a CPU tensor is
    the tensor itself, so a CPU run's next steps changed weights that the background write had
    yet to read, and the checkpoint mixed steps. There the state is copied here."""
    import torch.distributed.checkpoint as dcp

    if not takes(dcp.async_save, "async_stager"):
        from torch.distributed.checkpoint.stateful import Stateful

        state = {
            k: _cpu_copy(v.state_dict() if isinstance(v, Stateful) else v) for k, v in state.items()
        }
    return dcp_call(dcp.async_save, state, **kwargs)


def _cpu_copy(value: Any) -> Any:
    """``value`` with each CPU tensor in it cloned (GPU tensors are copied by the offload)."""
    if isinstance(value, torch.Tensor):
        return value.clone() if value.device.type == "cpu" else value
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cpu_copy(v) for v in value)
    return value


def fsdp_runs_on(device: torch.device) -> bool:
    """Whether FSDP2 can shard on ``device``'s type here: on CPU it needs torch 2.7, whose CPU
    stream has the ``record_event`` that FSDP2's all-gather calls (2.6 fails there at the first
    forward, deep inside torch)."""
    return device.type != "cpu" or hasattr(torch.cpu.Stream, "record_event")


def shard_of_whole(
    value: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement]
) -> DTensor:
    """This rank's part, as a DTensor, of ``value``, which every rank holds whole and the same:
    cut here, without communication, where torch can (``src_data_rank=None``, 2.7 on); before,
    scattered from rank 0, which gives the same values at one collective per parameter."""
    from torch.distributed.tensor import distribute_tensor

    if takes(distribute_tensor, "src_data_rank"):
        return distribute_tensor(value, mesh, placements, src_data_rank=None)
    return distribute_tensor(value, mesh, placements)
