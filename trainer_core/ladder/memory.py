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
vectors). Fitted to saved-tensor counts on three shapes, a fourth reproduced to 0.03%
(``benchmarks/RESULTS.md``). With the rest of this module, five steps at the 1B dims measured
on an H200 (compiled, bf16 autocast; AC off, full and every 2nd block; one micro-batch and
two) come within -0.2% to +0.3% of their peaks (``tests/unit/ladder/test_memory.py``).

The peak is the largest of the moments that can hold it, walking the step as it runs: the loss's
backward (everything the blocks kept, the head and loss at their peak), each block's backward
(what the blocks not yet gone back through kept, and a checkpointed block's recomputation,
which starts only once the loss's tensors are freed), and the end of backward (every gradient).
Accumulating, the gradients of the earlier micro-batches are live throughout; with one
micro-batch a step's gradients appear only as backward makes them (they are freed after each
optimizer step), so they never meet the loss's peak. Not counted: the gradients in flight
through a non-checkpointed block's backward (a few % of one block's saved tensors: the
activation-heavy CPU cases sit 2-6% low for it).
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
COMPILED_LOGIT_COPIES = 1
"""Compiled with the head, vocabulary-wide tensors at the loss's peak: one buffer in the compute
dtype, the head's output saved for backward, which the backward overwrites with its gradient
(CPU: 4.05 and 2.04 bytes per vocabulary entry, fp32 and bf16; on an H200 the full-AC micro-8
step at 1B peaks at 27.9 GiB, which leaves room for one 6.1 GiB bf16 copy beside the weights,
AdamW and the checkpointed inputs, not two). z-loss adds none (module doc)."""
COMPILED_LAYER_BYTES = {False: (12, 12, 28), True: (6, 6, 16)}
"""Compiled, bytes a block saves per token for each MLP-hidden, key/value-width and model-width
unit, by whether compute is 16-bit (see the module doc)."""
RECOMPUTED_LAYER_BYTES = {
    (True, False): (24, 12, 28),
    (True, True): (12, 6, 22),
    (False, False): (24, 16, 40),
    (False, True): (12, 14, 40),
}
"""A checkpointed block's backward at its peak, bytes per token for each MLP-hidden,
key/value-width and model-width unit, by (compiled, 16-bit compute): the tensors its recomputed
forward saves and the gradients in flight beside them. Measured on one block (CPU allocator
events, four shapes varying each width; the rest is under 60 bytes a token): compiled, the
saved tensors of :data:`COMPILED_LAYER_BYTES` plus three MLP-hidden gradients in the compute
dtype (model width 18-22 bytes in bf16, the larger taken); eager, what an eager block saves
(16 / 12 / 40 in fp32, 8 / 14 / 40 in bf16) plus two MLP-hidden gradients (and one
key/value-width one in fp32), the same with checkpointing or without."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device at the step's peak, by what holds them (module doc)."""

    params: float
    """Sharded fp32 parameters."""
    grads: float
    """Sharded fp32 gradients live at the peak: all of them while accumulating; with one
    micro-batch, those backward has made by then (none at the loss's peak)."""
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
    weights outside the embedding, from their first forward use to their backward (measured on
    an H100 at 1B: 2.4 GiB, two bytes per parameter outside the embedding). Eager, autocast's
    cache holds every copy to the end of the forward, the loss's included; compiled, the cast
    is an op inside each block's graph, so a checkpointed block keeps no copy (it casts again
    when recomputed) and only the other blocks' and the head's count."""
    activations: float
    """Kept by the blocks for backward at the peak, for one micro-batch: a non-checkpointed
    block's saved tensors, a checkpointed block's fp32 input, of the blocks backward has not
    yet gone through; where the peak is a checkpointed block's backward, its recomputation
    (:data:`RECOMPUTED_LAYER_BYTES`)."""
    logits: float
    """The head and loss at the loss's peak, for one micro-batch, where that is the step's peak
    (0 elsewhere: they are freed before the blocks' backward). Eager, the loss's fp32
    intermediates (:data:`LOGIT_BYTES`); compiled with the head (the loss upcasts inside its
    fused kernels), the head's output in the compute dtype, overwritten by its gradient
    (:data:`COMPILED_LOGIT_COPIES`), the gradients the backward computes from it (the head
    weight's and its input's, in the compute dtype) and the head's saved inputs (fp32 and
    normalized)."""

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


def layer_bytes(model: ModelConfig, tp: int, units: tuple[int, int, int]) -> float:
    """Bytes per token of one block, from bytes per (MLP-hidden, key/value-width, model-width)
    unit (:data:`COMPILED_LAYER_BYTES`, :data:`RECOMPUTED_LAYER_BYTES`); under tensor
    parallelism the MLP-hidden and key/value parts split, the model-width part is counted whole
    (on the safe side: it holds the norms' inputs and outputs, which TP does not split)."""
    hidden, kv_width, width = units
    kv = model.n_kv_heads * model.head_dim
    return (hidden * model.mlp_hidden + kv_width * kv) / tp + width * model.d_model


def checkpointed_blocks(model: ModelConfig, parallel: ParallelConfig) -> list[bool]:
    """Which blocks activation checkpointing wraps, in forward order: every block, or every
    ``ac_every_k``-th from the first
    (:func:`trainer_core.parallel.wrap.apply_activation_checkpointing`)."""
    mode = parallel.activation_checkpointing
    every = {"none": 0, "full": 1}.get(mode, parallel.ac_every_k)
    return [every > 0 and i % every == 0 for i in range(model.n_layers)]


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
    """Per-device bytes at the peak of a step: ``micro_seqs`` sequences per forward,
    ``grad_accum`` forwards per step, each tensor-parallel rank's parameters
    (:func:`rank_params`) sharded over ``dp_shard`` devices.

    The peak is the largest of the moments the module doc names, each counted as what is live
    then: the loss's backward, each block's backward (backward runs from the last block to the
    first) and the end of backward.
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
    checkpointed = checkpointed_blocks(model, parallel)
    autocast = not fsdp and autocast_precision(parallel, train_module, fsdp=False) is not None
    cached = 0.0
    if autocast:
        copied = model.n_layers - (sum(checkpointed) if parallel.compile else 0)
        cached = 2 * (root - count_params(model)["embedding"] + copied * block)
    tokens = micro_seqs * seq_len
    sixteen_bit = computes_in_16_bit(parallel, train_module)
    if parallel.compile:
        saved = layer_bytes(model, tp, COMPILED_LAYER_BYTES[sixteen_bit])
    else:
        saved = layer_activation_elements(model, tp) * activation_bytes_per_element(
            parallel, train_module
        )
    # What each block keeps from its forward to its backward: its saved tensors, or, where
    # checkpointed, its fp32 input alone.
    kept = [tokens * (4 * model.d_model if ck else saved) for ck in checkpointed]
    recompute = tokens * layer_bytes(
        model, tp, RECOMPUTED_LAYER_BYTES[(parallel.compile, sixteen_bit)]
    )
    if parallel.compile and autocast:
        recompute += 2 * block  # the recomputed block's 16-bit weight copies
    compute_bytes = 2 if sixteen_bit else 4
    if parallel.compile:
        loss = tokens * model.vocab_size * COMPILED_LOGIT_COPIES * compute_bytes
        # the two gradients computed from the logits' gradient while it is live, the head
        # weight's and its input's, in the compute dtype; the head's saved inputs, the fp32
        # residual stream (final norm) and its normalized copy in the compute dtype (projection)
        loss += model.vocab_size * model.d_model * compute_bytes
        loss += tokens * (4 + 2 * compute_bytes) * model.d_model
    else:
        logit_bytes = LOGIT_BYTES + (Z_LOSS_LOGIT_BYTES if train_module.z_loss_multiplier else 0)
        loss = tokens * model.vocab_size * logit_bytes
    # Gradients live as backward goes: accumulating, all of them (the earlier micro-batches');
    # else the head's first (tied or not, its weight's gradient is made there), then each
    # block's as backward leaves it, the embedding's last.
    head_grads = 4 * (model.vocab_size * model.d_model + model.d_model) / dp_shard
    block_grads = 4 * block / dp_shard

    def grads_after(blocks_done: int) -> float:
        return params if grad_accum > 1 else min(params, head_grads + blocks_done * block_grads)

    below = sum(kept)  # kept by the blocks backward has not gone through yet
    phases = [(params if grad_accum > 1 else 0.0, below, loss)]  # the loss's backward
    for done, i in enumerate(reversed(range(model.n_layers))):  # block i's backward
        phases.append((grads_after(done), below + (recompute if checkpointed[i] else 0.0), 0.0))
        below -= kept[i]
    # the end of backward: every gradient, and the one arriving at the embedding's output
    phases.append((params, tokens * 4 * model.d_model, 0.0))
    grads, activations, logits = max(phases, key=sum)
    return MemoryEstimate(
        params=params,
        grads=grads,
        optimizer=2 * params,
        unsharded_grads=unsharded,
        gathered_params=gathered,
        autocast_weights=cached,
        activations=activations,
        logits=logits,
    )
