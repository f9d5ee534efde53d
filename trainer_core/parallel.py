"""Device mesh and model wrapping: tensor parallel, activation checkpointing, compile, FSDP2.

Applied in torchtitan's order (TP -> AC -> compile -> FSDP) so each transform sees the module
structure it expects. The mesh is (dp_replicate, dp_shard, tp); FSDP2 shards over dp_shard and
replicates over dp_replicate (HSDP), on the dp sub-mesh when tp > 1 (2D).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer_core.config import ParallelConfig
from trainer_core.configio import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def mesh_shape(cfg: ParallelConfig, world_size: int) -> tuple[int, int, int]:
    if world_size % (cfg.dp_replicate * cfg.tp):
        raise ConfigError(
            f"parallel.tp: dp_replicate={cfg.dp_replicate} x tp={cfg.tp} does not divide the "
            f"world size {world_size}"
        )
    shard = cfg.dp_shard if cfg.dp_shard != -1 else world_size // (cfg.dp_replicate * cfg.tp)
    if cfg.dp_replicate * shard * cfg.tp != world_size:
        raise ConfigError(
            f"parallel.dp_shard: dp_replicate={cfg.dp_replicate} x dp_shard={shard} x tp={cfg.tp} "
            f"= {cfg.dp_replicate * shard * cfg.tp} devices, but the world size is {world_size}"
        )
    return cfg.dp_replicate, shard, cfg.tp


def build_mesh(cfg: ParallelConfig, world_size: int, device_type: str) -> DeviceMesh | None:
    shape = mesh_shape(cfg, world_size)
    if world_size == 1:
        return None
    return init_device_mesh(device_type, shape, mesh_dim_names=("dp_replicate", "dp_shard", "tp"))


def dp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The data-parallel sub-mesh (replicate x shard flattened): ranks that see different data."""
    return mesh["dp_replicate", "dp_shard"]._flatten("dp")


def dp_rank_and_size(mesh: DeviceMesh | None) -> tuple[int, int]:
    if mesh is None:
        return 0, 1
    dp = dp_mesh(mesh)
    return dp.get_local_rank(), dp.size()


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    cfg = model.cfg
    tp = tp_mesh.size()
    for name, count in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads)):
        if count % tp:
            raise ConfigError(f"parallel.tp: {tp} does not divide model.{name}={count}")
    plan = {
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(),
        "mlp.w_gate": ColwiseParallel(),
        "mlp.w_up": ColwiseParallel(),
        "mlp.w_down": RowwiseParallel(),
    }
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, plan)
        # QK-norm weights are shared by all heads but each rank normalises only its own heads:
        # their gradients are partial sums until added up over the TP group.
        for norm in (block.attn.q_norm, block.attn.k_norm):
            if norm is not None:
                norm.grad_group = tp_mesh.get_group()


class CheckpointedBlock(nn.Module):
    """Recomputes its block's activations in backward instead of storing them."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.block, x, rotations, use_reentrant=False)


def apply_activation_checkpointing(model: nn.Module, cfg: ParallelConfig) -> None:
    every = 1 if cfg.activation_checkpointing == "full" else cfg.ac_every_k
    for i, key in enumerate(list(model.blocks.keys())):
        if i % every == 0:
            model.blocks[key] = CheckpointedBlock(model.blocks[key])


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, cfg: ParallelConfig) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=DTYPES[cfg.param_dtype], reduce_dtype=DTYPES[cfg.reduce_dtype]
    )
    fsdp_mesh = mesh["dp_replicate", "dp_shard"] if cfg.dp_replicate > 1 else mesh["dp_shard"]
    for block in model.blocks.values():
        fully_shard(block, mesh=fsdp_mesh, mp_policy=mp)
    fully_shard(model, mesh=fsdp_mesh, mp_policy=mp)


def parallelize_model(
    model: nn.Module, mesh: DeviceMesh | None, cfg: ParallelConfig, device: torch.device
) -> nn.Module:
    model.to(device)
    if mesh is not None and cfg.tp > 1:
        apply_tensor_parallel(model, mesh["tp"])
    if cfg.activation_checkpointing != "none":
        apply_activation_checkpointing(model, cfg)
    if cfg.compile:
        for key, block in model.blocks.items():
            model.blocks[key] = torch.compile(block)
    if mesh is not None and dp_rank_and_size(mesh)[1] > 1:
        apply_fsdp(model, mesh, cfg)
    return model


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """Global pre-clip L2 norm of all gradients (every shard, every rank); clips if asked.

    Gradients live on different meshes (TP'd weights on dp x tp, norms on dp only), so norms are
    taken per (mesh, placements) group, each made whole with one collective, then combined.
    """
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    groups: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    squares = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares.append(norm.float() ** 2)
    total = torch.stack(squares).sum().sqrt()
    if max_norm is not None:
        coef = min(1.0, max_norm / (total.item() + 1e-6))
        if coef < 1.0:
            for g in grads:  # a Python scalar scales plain tensors and DTensors alike
                g.mul_(coef)
    return total
