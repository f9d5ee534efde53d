"""Per-device memory of one training step, estimated from the config (no torch, no devices).

The planner picks micro-batches and meshes with it and the dry run prints it, so it must hold on
the cluster: every term is a named field, and ``benchmarks/memory.py`` checks the total against
measured peaks (``benchmarks/RESULTS.md``).

Activations are counted from what this model's blocks save for backward, measured with
``torch.autograd.graph.saved_tensors_hooks``: per token and layer, 4 MLP-hidden vectors (gate,
up, their SiLU and product) and about 10 model-width plus 3 key/value-width vectors (norm inputs
and outputs, q/k/v before and after QK-norm and RoPE, the attention output). That is 4 bytes
an element in fp32. 16-bit compute saves about 0.8x that, not 0.5x, both ways it comes
(:mod:`trainer_core.parallel.precision`): under autocast the residual stream stays fp32, and with FSDP's
bf16 ``param_dtype`` the norms and RoPE still save fp32 copies of their inputs (counted with the
hooks: 0.76x and 0.77x; measured steps agree, ``benchmarks/RESULTS.md``).

Compiled (``parallel.compile``), inductor's partitioner recomputes the cheap elementwise work
in backward instead of saving it: per token and layer a block saves 3 MLP-hidden, 3
key/value-width and 7 model-width vectors in fp32; under 16-bit compute the same at 2 bytes but
for the model-width part, 16 bytes (two fp32 residual-stream inputs of the norms, four 16-bit
vectors). Fitted to saved-tensor counts on three shapes, a fourth reproduced to 0.03%; at the
1B dims the estimate is within -0.9% to +6.1% of the peaks measured on an H100 and an H200
(``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from trainer_core.config.sections import ModelConfig, ParallelConfig, TrainModuleConfig
from trainer_core.model.counts import count_params
from trainer_core.parallel.precision import autocast_precision, computes_in_16_bit

LOGIT_BYTES = 12
"""Per vocabulary entry and token at the peak, cross-entropy's backward: the fp32 log-softmax it
saved, the gradient arriving at it and the gradient it passes to the logits (measured: 12.0; the
fp32 logits themselves are freed once the log-softmax exists, and a 16-bit head output under
bf16 is freed once upcast, so precision does not change it)."""
Z_LOSS_LOGIT_BYTES = 8
"""With z-loss on top: its logsumexp keeps the fp32 logits for backward and adds their gradient
(measured: 20.0 in all)."""
BF16_ACTIVATION_RATIO = 0.8
"""Saved activation bytes under 16-bit compute relative to fp32 (see the module doc)."""
COMPILED_LOGIT_COPIES = 2
"""Compiled with the head, vocabulary-wide tensors at the loss's peak: the head's output saved
for backward and its gradient, in the compute dtype (z-loss adds none; module doc)."""
COMPILED_LAYER_BYTES = {False: (12, 12, 28), True: (6, 6, 16)}
"""Compiled, bytes a block saves per token for each MLP-hidden, key/value-width and model-width
unit, by whether compute is 16-bit (see the module doc)."""


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
    """Unsharded gradients (this TP rank's whole part) that FSDP keeps while gradient sync is off
    (every micro-batch but the last)."""
    gathered_params: float
    """Parameters FSDP has all-gathered, in param dtype: the root unit (embedding, LM head, final
    norm) from its forward to the end of backward (FSDP2 does not reshard the root), and two
    blocks at a time (the one computing and the one prefetched)."""
    autocast_weights: float
    """Where autocast makes the 16-bit compute (one device, TP alone): the 16-bit copies of the
    weights it caches from the first forward use to the end of backward (measured on an H100 at
    1B: 2.4 GiB, two bytes per parameter outside the embedding)."""
    activations: float
    """Saved for backward by the transformer blocks, for one micro-batch."""
    logits: float
    """The loss's intermediates over the vocabulary at their peak, for one micro-batch: eager,
    fp32 ones (:data:`LOGIT_BYTES`); compiled with the head (the loss upcasts inside its fused
    kernels), the head's output saved for backward and its gradient, in the compute dtype."""

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def activation_bytes_per_element(
    parallel: ParallelConfig, train_module: TrainModuleConfig
) -> float:
    """Average bytes of a saved activation element (see the module doc)."""
    return 4.0 * (BF16_ACTIVATION_RATIO if computes_in_16_bit(parallel, train_module) else 1.0)


def rank_params(model: ModelConfig, tp: int) -> tuple[float, float]:
    """(root unit, one block): parameters one tensor-parallel rank holds of each FSDP unit before
    FSDP shards it. TP splits only the blocks' linear layers (a ``1/tp`` slice each); the
    embedding, the LM head and every norm stay whole on each TP rank
    (:func:`trainer_core.parallel.wrap.apply_tensor_parallel`)."""
    counts = count_params(model)
    block = counts["blocks"] / model.n_layers
    block_norms = 2 * model.d_model + (2 * model.head_dim if model.qk_norm else 0)
    root = counts["embedding"] + counts["head"] + model.d_model
    return root, (block - block_norms) / tp + block_norms


def layer_activation_elements(model: ModelConfig, tp: int) -> float:
    """Elements one eager block saves per token (split over tensor-parallel ranks but for the
    norms)."""
    kv = model.n_kv_heads * model.head_dim
    split = 4 * model.mlp_hidden + 6 * model.d_model + 3 * kv
    return split / tp + 4 * model.d_model


def compiled_layer_bytes(model: ModelConfig, tp: int, sixteen_bit: bool) -> float:
    """Bytes one compiled block saves per token (:data:`COMPILED_LAYER_BYTES`); under tensor
    parallelism the MLP-hidden and key/value parts split, the model-width part is counted
    whole (on the safe side: it holds the norms' inputs and outputs, which TP does not split)."""
    hidden, kv_width, width = COMPILED_LAYER_BYTES[sixteen_bit]
    kv = model.n_kv_heads * model.head_dim
    return (hidden * model.mlp_hidden + kv_width * kv) / tp + width * model.d_model


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
    per step, each tensor-parallel rank's parameters (:func:`rank_params`) sharded over
    ``dp_shard`` devices.

    With activation checkpointing a checkpointed block keeps only its fp32 input, and backward
    recomputes one block at a time (its full activations, once; counted as eager's even when
    compiled, which puts a compiled full-AC step 3.8% above its measured peak, where the
    compiled count put it 9% below).
    """
    tp = parallel.tp
    root, block = rank_params(model, tp)
    local = root + model.n_layers * block
    params = 4 * local / dp_shard
    unsharded = 0.0
    if grad_accum > 1 and dp_shard > 1 and not train_module.reduce_grads_every_micro_batch:
        unsharded = 4 * local
    fsdp = dp_shard * parallel.dp_replicate > 1
    gathered = 0.0
    if fsdp:
        gathered = (2 if parallel.param_dtype == "bfloat16" else 4) * (root + 2 * block)
    cached = 0.0
    if not fsdp and autocast_precision(parallel, train_module, fsdp=False):
        cached = 2 * (local - count_params(model)["embedding"])
    tokens = micro_seqs * seq_len
    sixteen_bit = computes_in_16_bit(parallel, train_module)
    full = layer_activation_elements(model, tp) * activation_bytes_per_element(
        parallel, train_module
    )
    saved = compiled_layer_bytes(model, tp, sixteen_bit) if parallel.compile else full
    if parallel.activation_checkpointing == "none":
        checkpointed = 0
    elif parallel.activation_checkpointing == "full":
        checkpointed = model.n_layers
    else:
        checkpointed = -(-model.n_layers // parallel.ac_every_k)
    per_token = (model.n_layers - checkpointed) * saved + checkpointed * 4 * model.d_model
    if checkpointed:
        per_token += full  # the block being recomputed
    if parallel.compile:
        logit_bytes = COMPILED_LOGIT_COPIES * (2 if sixteen_bit else 4)
    else:
        logit_bytes = LOGIT_BYTES + (Z_LOSS_LOGIT_BYTES if train_module.z_loss_multiplier else 0)
    return MemoryEstimate(
        params=params,
        grads=params,
        optimizer=2 * params,
        unsharded_grads=unsharded,
        gathered_params=gathered,
        autocast_weights=cached,
        activations=tokens * per_token,
        logits=tokens * model.vocab_size * logit_bytes,
    )
