"""Per-device memory of one training step, estimated from the config (no torch, no devices).

The planner picks micro-batches and meshes with it and the dry run prints it, so it must hold on
the cluster: every term is a named field, and ``benchmarks/memory.py`` checks the total against
measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from trainer_core.config import ModelConfig, ParallelConfig, TrainModuleConfig
from trainer_core.model import count_params


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device, by what holds them."""

    params: float
    """Sharded fp32 parameters."""
    grads: float
    """Sharded fp32 gradients."""
    optimizer: float
    """AdamW's two moments, sharded."""
    unsharded_grads: float
    """Full-size gradients FSDP keeps while gradient sync is off (every micro-batch but the last)."""
    activations: float
    """Saved for backward by the transformer blocks, for one micro-batch."""
    logits: float
    """The output logits and their fp32 cross-entropy intermediates, for one micro-batch."""

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def estimate_memory(
    model: ModelConfig,
    parallel: ParallelConfig,
    train_module: TrainModuleConfig,
    *,
    seq_len: int,
    micro_seqs: int,
    dp_shard: int,
    grad_accum: int,
) -> MemoryEstimate:
    """Per-device bytes of a step: ``micro_seqs`` sequences per forward, ``grad_accum`` forwards
    per step, parameters sharded over ``dp_shard`` x ``parallel.tp`` devices.

    Activations per token per layer follow Korthikanti et al. 2022: 34*d bytes in 16-bit without
    recomputation, ~2*d with full activation checkpointing.
    """
    counts = count_params(model)
    shards = dp_shard * parallel.tp
    params = 4 * counts["total"] / shards
    checkpointing = parallel.activation_checkpointing != "none"
    tokens = micro_seqs * seq_len
    per_layer = (2 if checkpointing else 34) * model.d_model
    unsharded = 0.0
    if grad_accum > 1 and dp_shard > 1 and not train_module.reduce_grads_every_micro_batch:
        unsharded = 4 * counts["total"] / parallel.tp
    return MemoryEstimate(
        params=params,
        grads=params,
        optimizer=2 * params,
        unsharded_grads=unsharded,
        activations=tokens * model.n_layers * per_layer,
        logits=tokens * 8 * model.vocab_size,
    )
