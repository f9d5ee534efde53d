"""Where the model's weights come into being: on the device that trains them, one rank's part
at a time.

The model is built on the meta device, so float8, TP, AC, compile and FSDP2 act on shapes alone
(as torchtitan does); then it is allocated where it runs and each parameter's whole initial value
is drawn there in turn and cut to the rank's shard. No process holds the whole model in host
memory (a 7B model is 28 GB in fp32 per rank, drawn on the CPU before), and the weights are
those :class:`~trainer_core.model.transformer.Transformer` draws in one process, whatever the
mesh: a sharded run starts where a single-process run does.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from trainer_core.config.sections import ModelConfig, ParallelConfig
from trainer_core.model.transformer import Transformer
from trainer_core.parallel.wrap import parallelize_model


def build_model(
    model_cfg: ModelConfig,
    max_seq_len: int,
    mesh: DeviceMesh | None,
    cfg: ParallelConfig,
    device: torch.device,
    seed: int,
) -> Transformer:
    """The model wrapped as ``cfg`` says, its initial weights (seeded by ``seed``) on ``device``."""
    with torch.device("meta"):
        model = Transformer(model_cfg, max_seq_len)
    parallelize_model(model, mesh, cfg, device)
    materialize(model, device, seed, sharded=mesh is not None)
    return model


@torch.no_grad()
def materialize(model: Transformer, device: torch.device, seed: int, *, sharded: bool) -> None:
    """Allocate a meta-built model on ``device`` and write its initial weights: each parameter
    drawn whole on ``device``, then, where ``sharded`` (a mesh: FSDP2 or TP), this rank's slice
    of it kept."""
    if sharded:  # DTensor's modules (~1 s to import) only where a mesh made DTensors
        from torch.distributed.tensor import DTensor

        from trainer_core.compat import shard_of_whole
    model.to_empty(device=device)
    model.tie_weights()
    model.init_buffers()
    for p, value in model.initial_parameters(seed, device):
        if sharded and isinstance(p, DTensor):
            # Every rank drew the same whole value: each keeps its slice.
            value = shard_of_whole(value, p.device_mesh, p.placements)
        p.copy_(value)
