"""Per-device memory of one training step, estimated from the config (no torch, no devices).

The planner picks micro-batches and meshes with it and the dry run prints it, so it must hold on
the cluster: every term is a named field, and ``benchmarks/memory.py`` checks the total against
measured peaks (``benchmarks/RESULTS.md``).

Activations are counted from what this model's blocks save for backward, measured with
``torch.autograd.graph.saved_tensors_hooks``: per token and layer, 4 MLP-hidden vectors (gate,
up, their SiLU and product) and about 10 model-width plus 3 key/value-width vectors (norm inputs
and outputs, q/k/v before and after QK-norm and RoPE, the attention output). That is in the
activation dtype: fp32 without autocast; under bf16 autocast the norms and the residual stream
stay fp32, which measured 0.8x of fp32 rather than 0.5x. FSDP's bf16 ``param_dtype`` without
autocast computes everything in bf16 (0.5x).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from trainer_core.config import ModelConfig, ParallelConfig, TrainModuleConfig
from trainer_core.model import count_params

LOGIT_BYTES = 16
"""Per vocabulary entry and token: the fp32 logits, their log-softmax (saved by cross-entropy)
and, in backward, the gradients of both."""
BF16_LOGIT_EXTRA = 2
"""16-bit logits are upcast for the loss: the 16-bit copy (and its gradient) come on top."""


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


def activation_bytes_per_element(
    parallel: ParallelConfig, train_module: TrainModuleConfig
) -> float:
    """Average bytes of a saved activation element (see the module doc)."""
    if train_module.autocast_precision:
        return 0.8 * 4
    return 2.0 if parallel.param_dtype == "bfloat16" else 4.0


def layer_activation_elements(model: ModelConfig, tp: int) -> float:
    """Elements one block saves per token (split over tensor-parallel ranks but for the norms)."""
    kv = model.n_kv_heads * model.head_dim
    split = 4 * model.mlp_hidden + 6 * model.d_model + 3 * kv
    return split / tp + 4 * model.d_model


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

    With activation checkpointing a checkpointed block keeps only its fp32 input, and backward
    recomputes one block at a time (its full activations, once).
    """
    counts = count_params(model)
    tp = parallel.tp
    params = 4 * counts["total"] / (dp_shard * tp)
    unsharded = 0.0
    if grad_accum > 1 and dp_shard > 1 and not train_module.reduce_grads_every_micro_batch:
        unsharded = 4 * counts["total"] / tp
    tokens = micro_seqs * seq_len
    full = layer_activation_elements(model, tp) * activation_bytes_per_element(
        parallel, train_module
    )
    if parallel.activation_checkpointing == "none":
        checkpointed = 0
    elif parallel.activation_checkpointing == "full":
        checkpointed = model.n_layers
    else:
        checkpointed = -(-model.n_layers // parallel.ac_every_k)
    per_token = (model.n_layers - checkpointed) * full + checkpointed * 4 * model.d_model
    if checkpointed:
        per_token += full  # the block being recomputed
    logit_bytes = LOGIT_BYTES + (BF16_LOGIT_EXTRA if train_module.autocast_precision else 0)
    return MemoryEstimate(
        params=params,
        grads=params,
        optimizer=2 * params,
        unsharded_grads=unsharded,
        activations=tokens * per_token,
        logits=tokens * model.vocab_size * logit_bytes,
    )
