"""AdamW with the usual LLM parameter groups.

Weight decay pulls matrices toward zero; applied to norm gains or biases it only fights the
normalisation, and on embeddings it shrinks rare tokens' rows, so both are excluded by default
(switchable). Fused AdamW on CUDA (one kernel for all parameters), foreach elsewhere.
DTensor (~1 s to import) is looked up only when an optimizer is built, where sharding may apply.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer_core.config.sections import OptimConfig


def parameter_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    decay, no_decay = [], []
    embedding_params = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if id(p) in embedding_params:
            (decay if cfg.decay_embeddings else no_decay).append(p)
        elif p.dim() < 2:
            (decay if cfg.decay_norms_and_biases else no_decay).append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    from torch.distributed.tensor import DTensor

    kinds = {isinstance(p, DTensor) for p in model.parameters()}
    # Tensor parallel without FSDP leaves norms/embeddings as plain tensors beside DTensor
    # weights; the multi-tensor kernels refuse such a mix, so fall back to per-tensor updates.
    mixed = len(kinds) > 1
    fused = cfg.fused if cfg.fused is not None else device.type == "cuda" and not mixed
    return torch.optim.AdamW(
        parameter_groups(model, cfg),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=fused,
        foreach=None if fused else not mixed,
    )
