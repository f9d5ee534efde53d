"""Device mesh and model wrapping: float8, TP, activation checkpointing, compile, FSDP2.

Applied in torchtitan's order (float8 -> TP -> AC -> compile -> FSDP) so each transform sees the
module structure it expects. The mesh's shape and each rank's data-parallel place come from
:mod:`trainer_core.parallel.mesh` (no torch), the rule the planner and the Ray layer use too. FSDP2 shards
over dp_shard and replicates over dp_replicate (HSDP), on the dp sub-mesh when tp > 1 (2D).

Wrappers keep checkpoints portable: ``checkpoint_wrapper`` and ``torch.compile`` add
``_checkpoint_wrapped_module.`` / ``_orig_mod.`` to parameter names, which
``torch.distributed.checkpoint.state_dict`` strips, so a run saved with AC or compile loads
without them and vice versa.

The TP, AC and FSDP2 modules (DTensor among them, ~1 s) are imported by the functions that apply
them: a single-device run never loads them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer_core.compat import fsdp_runs_on
from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import ParallelConfig
from trainer_core.parallel.float8 import check_float8, convert_to_float8
from trainer_core.parallel.mesh import MESH_DIMS, mesh_shape

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_mesh(
    cfg: ParallelConfig, world_size: int, device_type: str, *, one_rank: bool = False
) -> DeviceMesh | None:
    """The 3D mesh named :data:`MESH_DIMS`; None for a single process (nothing to shard) unless
    ``one_rank``: then a one-rank mesh, on which :func:`parallelize_model` applies FSDP2 (the
    GPU benchmark's bf16-policy-vs-autocast comparison)."""
    shape = mesh_shape(cfg, world_size)
    if world_size == 1 and not one_rank:
        return None
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)
    dp_mesh(mesh)
    if cfg.tp > 1:
        # A 2D-sharded gradient's norm is partial over dp_shard and tp; with this flattened
        # dim DTensor reduces it in one all-reduce instead of two in a row.
        mesh["dp_shard", "tp"]._flatten("dp_shard_tp")
    return mesh


def uses_fsdp(mesh: DeviceMesh | None) -> bool:
    """FSDP2 wraps the model: on more than one data-parallel rank, or on a one-rank mesh
    (``build_mesh(..., one_rank=True)``). A TP-only mesh leaves it unsharded."""
    return mesh is not None and (mesh.size() == 1 or dp_mesh(mesh).size() > 1)


def dp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The data-parallel sub-mesh (replicate x shard flattened): ranks that see different data,
    for splitting batches and counting the global tokens of the loss."""
    return mesh["dp_replicate", "dp_shard"]._flatten("dp")


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Megatron-style TP inside each block; embedding, norms and head stay replicated.

    Column-wise q/k/v and gate/up leave each rank with its own heads / hidden units; the
    row-wise output projections sum the partial results, so a block's output is whole again.
    """
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model.cfg.check_tensor_parallel(tp_mesh.size())
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


def apply_activation_checkpointing(model: nn.Module, cfg: ParallelConfig) -> None:
    """Recompute block activations in backward: every block ("full") or every k-th ("every_k")."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    every = 1 if cfg.activation_checkpointing == "full" else cfg.ac_every_k
    for i, key in enumerate(list(model.blocks.keys())):
        if i % every == 0:
            # Non-reentrant torch.utils.checkpoint: works with FSDP2, DTensor and compile.
            model.blocks[key] = checkpoint_wrapper(model.blocks[key])


def apply_compile(model: nn.Module) -> None:
    """Compile each block separately, and the LM head with its loss: identical blocks share one
    graph, and the FSDP hooks between units stay outside the compiled regions.
    ``fullgraph=True``: a graph break is an error, not a silent fall back to eager for part of
    every block."""
    for key, block in list(model.blocks.items()):
        model.blocks[key] = torch.compile(block, fullgraph=True)
    model.lm_head = torch.compile(model.lm_head, fullgraph=True)


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, cfg: ParallelConfig) -> None:
    """FSDP2 per block, the LM head (final norm and output projection) as one unit, then the
    root (embedding).

    As torchtitan and OLMo-core: inputs are not cast (the fp32 RoPE table would be cast to bf16
    at every block; the embedding already hands the blocks bf16 activations), and the LM head
    unit stays gathered after forward, since backward needs it at once. A tied embedding/head
    weight is one parameter held by the embedding and the head, so the head stays in the root
    unit and is gathered once per forward.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=DTYPES[cfg.param_dtype],
        reduce_dtype=DTYPES[cfg.reduce_dtype],
        cast_forward_inputs=False,
    )
    fsdp_mesh = mesh["dp_replicate", "dp_shard"] if cfg.dp_replicate > 1 else mesh["dp_shard"]
    for block in model.blocks.values():
        fully_shard(block, mesh=fsdp_mesh, mp_policy=mp)
    if not model.cfg.tie_embeddings:
        fully_shard(model.lm_head, mesh=fsdp_mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=fsdp_mesh, mp_policy=mp)


def parallelize_model(
    model: nn.Module, mesh: DeviceMesh | None, cfg: ParallelConfig, device: torch.device
) -> nn.Module:
    """Apply float8, TP, AC, compile and FSDP2 as configured; returns the same (now wrapped)
    model. The model is on ``device`` already, or on the meta device (a run's model:
    :func:`trainer_core.parallel.materialize.build_model` allocates it after wrapping).

    ``param_dtype`` / ``reduce_dtype`` act through FSDP (:func:`uses_fsdp`); on one device
    without a mesh (or TP alone) bf16 comes from autocast (:mod:`trainer_core.parallel.precision`).
    """
    fsdp = uses_fsdp(mesh)
    if fsdp and not fsdp_runs_on(device):
        raise ConfigError(
            f"FSDP2 over {dp_mesh(mesh).size()} data-parallel rank(s) on CPU needs torch 2.7 or "
            f"newer, and this is torch {torch.__version__}: train on GPUs, upgrade torch, or "
            "run one process"
        )
    if cfg.float8 != "none":
        check_float8(cfg, device)
        convert_to_float8(model, cfg, fsdp=fsdp)
    if mesh is not None and cfg.tp > 1:
        apply_tensor_parallel(model, mesh["tp"])
    if cfg.activation_checkpointing != "none":
        apply_activation_checkpointing(model, cfg)
    if cfg.compile:
        apply_compile(model)
    if fsdp:
        apply_fsdp(model, mesh, cfg)
    return model


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """Global pre-clip L2 norm of all gradients (every shard, every rank); clips if asked.

    The value equals the single-process norm. Gradients live on different meshes (TP'd weights
    on dp x tp, norms and embeddings on dp only, plain replicated tensors under TP alone), so
    norms are taken per (mesh, placements) group, each made whole with one collective, then
    combined. Nothing here reads the norm on the host: the clip factor stays a device tensor
    applied with foreach kernels (a non-finite norm makes the caller skip or stop the step).
    """
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    groups: dict[object, list[nn.Parameter]] = {}
    for p in params:
        key = (p.grad.device_mesh, p.grad.placements) if isinstance(p.grad, DTensor) else None
        groups.setdefault(key, []).append(p)
    squares = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0, foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares.append(norm.float() ** 2)
    total = torch.stack(squares).sum().sqrt()
    if max_norm is not None:
        for group in groups.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return total
