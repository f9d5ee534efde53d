"""The memory estimate: each term responds to what changes it, and it holds against a real step."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ranks import join_as_rank
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from trainer_core.config.sections import ModelConfig, ParallelConfig, TrainModuleConfig
from trainer_core.ladder.memory import estimate_memory
from trainer_core.model.counts import count_params
from trainer_core.model.transformer import Transformer
from trainer_core.parallel.wrap import apply_tensor_parallel

MODEL = ModelConfig(size="1B", vocab_size=50304)


PARALLEL, MODULE = ParallelConfig(), TrainModuleConfig()


def estimate(parallel=PARALLEL, module=MODULE, **kw):
    args = {"seq_len": 4096, "micro_seqs": 2, "dp_shard": 8, "grad_accum": 4, **kw}
    return estimate_memory(MODEL, parallel, module, **args)


def test_terms_follow_sharding_accumulation_checkpointing_and_precision():
    base = estimate()
    assert estimate(dp_shard=16).params == pytest.approx(base.params / 2)
    # FSDP's unsharded gradients: only while accumulating over > 1 shard, and not when reducing
    # after every micro-batch; full size (per TP rank), 8x the sharded gradients here
    assert base.unsharded_grads == pytest.approx(8 * base.grads)
    assert estimate(grad_accum=1).unsharded_grads == 0
    assert estimate(dp_shard=1).unsharded_grads == 0
    every = TrainModuleConfig(reduce_grads_every_micro_batch=True)
    assert estimate(module=every).unsharded_grads == 0
    assert estimate(micro_seqs=4).activations == pytest.approx(2 * base.activations)
    full = estimate(parallel=ParallelConfig(activation_checkpointing="full"))
    every2 = estimate(parallel=ParallelConfig(activation_checkpointing="every_k", ac_every_k=2))
    assert full.activations < every2.activations < base.activations
    autocast = estimate(module=TrainModuleConfig(autocast_precision="bf16"))
    assert autocast.activations == pytest.approx(0.8 * base.activations)
    assert autocast.logits == base.logits  # the 16-bit head output is freed once upcast
    z_loss = estimate(module=TrainModuleConfig(z_loss_multiplier=1e-5))
    assert z_loss.logits == pytest.approx(20 / 12 * base.logits)  # its logsumexp keeps the logits
    bf16 = estimate(parallel=ParallelConfig(param_dtype="bfloat16"))
    assert bf16.activations == pytest.approx(0.8 * base.activations)  # fp32 norms and RoPE
    # FSDP's gathered parameters: in param dtype, and only where FSDP wraps the model
    assert bf16.gathered_params == pytest.approx(0.5 * base.gathered_params)
    assert estimate(dp_shard=1).gathered_params == 0
    # autocast's cached 16-bit weights: where autocast makes bf16 (one device here), not FSDP
    non_embedding = count_params(MODEL)["non_embedding"]
    one_device = estimate(parallel=ParallelConfig(param_dtype="bfloat16"), dp_shard=1)
    assert one_device.autocast_weights == pytest.approx(2 * non_embedding)
    assert bf16.autocast_weights == 0 and base.autocast_weights == 0
    assert autocast.autocast_weights == 0  # explicit autocast under FSDP: not measured, not counted
    assert base.total == pytest.approx(
        base.params
        + base.grads
        + base.optimizer
        + base.unsharded_grads
        + base.gathered_params
        + base.autocast_weights
        + base.activations
        + base.logits
    )


def _local_numel(module: torch.nn.Module) -> int:
    """The parameter elements this rank holds: a DTensor's local shard, a plain tensor whole."""
    params = module.parameters()
    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)


def _tp_rank_worker(rank: int, world: int, port: int, model: ModelConfig, out: str) -> None:
    """One of ``world`` TP ranks on a gloo group: ``apply_tensor_parallel`` splits the model,
    built on the meta device (no memory), and the rank writes (all, one block) it holds."""
    join_as_rank(rank, world, port)
    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        with torch.device("meta"):
            net = Transformer(model, 16)
        apply_tensor_parallel(net, mesh)
        Path(f"{out}.{rank}").write_text(
            json.dumps([_local_numel(net), _local_numel(net.blocks["0"])])
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("tp, tied", [(2, False), (4, True)])
def test_tensor_parallel_splits_only_the_block_linears(spawn_ranks, tmp_path, tp, tied):
    """Embedding, LM head and norms stay whole on every TP rank: dividing every parameter by tp
    undercounts them tp times."""
    model = replace(MODEL, tie_embeddings=tied)
    out = tmp_path / "held"
    spawn_ranks(_tp_rank_worker, tp, model, str(out))
    held = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(tp)]
    assert all(h == held[0] for h in held), held  # every rank holds as much
    local, block = held[0]
    root = local - model.n_layers * block
    assert local > 1.05 * count_params(model)["total"] / tp
    est = estimate_memory(
        model,
        ParallelConfig(tp=tp),
        MODULE,
        seq_len=4096,
        micro_seqs=2,
        dp_shard=8,
        grad_accum=4,
    )
    assert est.params == est.grads == pytest.approx(4 * local / 8)
    assert est.optimizer == pytest.approx(2 * est.params)
    assert est.unsharded_grads == pytest.approx(4 * local)
    # FSDP gathers the root unit (whole on every TP rank) and two blocks (TP slices) at a time
    assert est.gathered_params == pytest.approx(4 * (root + 2 * block))


def test_seven_b_on_four_gpus_counts_the_accumulation_gradients():
    """The issue's case: 7B on 4 H100s with accumulation, measured at ~71 GiB (the old estimate said 49);
    the unsharded fp32 gradient copy alone is 4 bytes per parameter (~29 GiB)."""
    seven_b = ModelConfig(size="7B", vocab_size=100352)
    est = estimate_memory(
        seven_b,
        ParallelConfig(activation_checkpointing="full"),
        TrainModuleConfig(autocast_precision="bf16"),
        seq_len=4096,
        micro_seqs=1,
        dp_shard=4,
        grad_accum=8,
    )
    params = (est.params + est.grads + est.optimizer) / 16 * 4  # all 4 shards' parameters
    assert est.unsharded_grads == pytest.approx(4 * params) and est.unsharded_grads > 28 * 2**30
    assert est.total / 2**30 == pytest.approx(71, rel=0.1)  # the issue measured ~71 GiB


def test_compiled_blocks_and_head_save_what_inductor_keeps():
    """Compiled: per token and layer 3 MLP-hidden, 3 key/value and 7 model-width fp32 vectors
    (16-bit: 2 bytes each but 16 bytes of model width); at the loss's peak one vocabulary-wide
    buffer in the compute dtype (the head's output, overwritten by its gradient), the gradients
    made from it (the head weight's and its input's) and the head's saved inputs, z-loss adding
    nothing."""
    compiled = ParallelConfig(compile=True)
    tokens, d, h, kv = 2 * 4096, MODEL.d_model, MODEL.mlp_hidden, MODEL.n_kv_heads * MODEL.head_dim
    vocab = MODEL.vocab_size
    fp32 = estimate(parallel=compiled)
    per_layer = 4 * (3 * h + 3 * kv + 7 * d)
    assert fp32.activations == pytest.approx(tokens * MODEL.n_layers * per_layer)
    head = vocab * d * 4 + tokens * (4 + 2 * 4) * d  # weight and input grads, saved inputs
    assert fp32.logits == pytest.approx(tokens * vocab * 4 + head)
    bf16 = estimate(parallel=compiled, module=TrainModuleConfig(autocast_precision="bf16"))
    assert bf16.activations == pytest.approx(tokens * MODEL.n_layers * (6 * h + 6 * kv + 16 * d))
    assert bf16.logits == pytest.approx(tokens * vocab * 2 + vocab * d * 2 + tokens * 8 * d)
    z_loss = estimate(parallel=compiled, module=TrainModuleConfig(z_loss_multiplier=1e-5))
    assert z_loss.logits == fp32.logits


def test_a_recomputed_block_and_the_loss_do_not_meet():
    """Backward recomputes a checkpointed block only after the loss's tensors are freed, and a
    block's recomputation only after the blocks above it are gone back through: the peak is the
    larger moment, not the sum (the old count added an eager block to the loss's peak)."""
    tokens, d = 2 * 4096, MODEL.d_model
    h, kv = MODEL.mlp_hidden, MODEL.n_kv_heads * MODEL.head_dim
    inputs = tokens * 4 * d  # a checkpointed block keeps its fp32 input
    full = ParallelConfig(compile=True, activation_checkpointing="full")
    args = {"seq_len": 4096, "micro_seqs": 2, "dp_shard": 8, "grad_accum": 4}
    # a 100k vocabulary: the loss's peak is the larger; no recomputed block beside it
    large = replace(MODEL, vocab_size=100352)
    at_loss = estimate_memory(large, full, MODULE, **args)
    assert at_loss.activations == pytest.approx(MODEL.n_layers * inputs)
    no_ac = replace(full, activation_checkpointing="none")
    assert at_loss.logits == pytest.approx(estimate_memory(large, no_ac, MODULE, **args).logits)
    # a byte vocabulary: the last block's recomputation is the peak, the loss's tensors freed
    small = replace(MODEL, vocab_size=320)
    recompute = tokens * (24 * h + 12 * kv + 28 * d)  # compiled fp32: saved + 3 hidden grads
    at_block = estimate_memory(small, full, MODULE, **args)
    assert at_block.logits == 0
    assert at_block.activations == pytest.approx(MODEL.n_layers * inputs + recompute)
    # every 2nd block from the first: block 14's recomputation comes after block 15 (not
    # checkpointed) has freed its saved tensors; 8 inputs and 7 saved blocks below it
    every = replace(full, activation_checkpointing="every_k", ac_every_k=2)
    saved = tokens * 4 * (3 * h + 3 * kv + 7 * d)
    est = estimate_memory(small, every, MODULE, **args)
    assert est.activations == pytest.approx(8 * inputs + 7 * saved + recompute)


def test_one_micro_batch_makes_its_gradients_after_the_loss():
    """With one micro-batch the gradients appear as backward makes them (the optimizer step
    frees none: zero_grad sets them to None), so the loss's peak holds none of them and the end
    of backward holds all of them beside hardly any activations; accumulating, the earlier
    micro-batches' gradients are there throughout."""
    full = ParallelConfig(compile=True, activation_checkpointing="full")
    large = replace(MODEL, vocab_size=100352)  # the loss's peak is the step's
    args = {"seq_len": 4096, "micro_seqs": 2, "dp_shard": 8}
    one = estimate_memory(large, full, MODULE, grad_accum=1, **args)
    accumulating = estimate_memory(large, full, MODULE, grad_accum=4, **args)
    assert one.grads == 0 and accumulating.grads == pytest.approx(accumulating.params)
    assert (one.activations, one.logits) == (accumulating.activations, accumulating.logits)
    # (and FSDP's unsharded gradients, which only accumulation keeps)
    held = accumulating.grads + accumulating.unsharded_grads
    assert one.total == pytest.approx(accumulating.total - held)
    # short sequences, one device: the end of backward is the peak, every gradient live and
    # only the gradient arriving at the embedding's output beside them
    tokens = 128
    end = estimate(dp_shard=1, grad_accum=1, seq_len=tokens, micro_seqs=1)
    assert end.grads == pytest.approx(end.params) and end.logits == 0
    assert end.activations == pytest.approx(tokens * 4 * MODEL.d_model)


def test_compiled_checkpointed_blocks_keep_no_autocast_copies():
    """Compiled, autocast's cast of a weight is an op inside the block's graph: a checkpointed
    block casts again when recomputed and keeps no 16-bit copy; the head and the blocks left
    uncheckpointed keep theirs. Eager, autocast's cache holds every copy to the end of the
    forward, the loss's included."""
    one_device = {"dp_shard": 1}
    bf16 = ParallelConfig(param_dtype="bfloat16")
    counts = count_params(MODEL)
    head, block = counts["head"] + MODEL.d_model, counts["blocks"] / MODEL.n_layers
    compiled_full = replace(bf16, compile=True, activation_checkpointing="full")
    assert estimate(parallel=compiled_full, **one_device).autocast_weights == pytest.approx(
        2 * head
    )
    compiled_every2 = replace(compiled_full, activation_checkpointing="every_k", ac_every_k=2)
    assert estimate(parallel=compiled_every2, **one_device).autocast_weights == pytest.approx(
        2 * (head + 8 * block)
    )
    eager_full = replace(bf16, activation_checkpointing="full")
    assert estimate(parallel=eager_full, **one_device).autocast_weights == pytest.approx(
        2 * counts["non_embedding"]
    )


# Peaks measured on one H200 at the 1B dims, vocabulary 100,352, seq 4096, compile on, bf16
# autocast over fp32 weights, fused AdamW (benchmarks/train_step.py; no AC at stop 41, AC
# after): (AC, micro-batch, accumulation) -> GiB.
GPU_PEAKS = {
    ("none", 4, 2): 51.3,
    ("none", 8, 2): 77.6,
    ("full", 4, 2): 28.2,
    ("full", 8, 1): 27.9,
    ("every_k", 4, 2): 39.7,
}


@pytest.mark.parametrize("ac, micro, accum", sorted(GPU_PEAKS))
def test_the_compiled_estimate_holds_against_the_gpu_peaks(ac, micro, accum):
    """Fitted on CPU, checked against the GPU: within 2% below and 10% above each peak (with
    AC the old count was 16-67% above: it added a recomputed eager block to the loss's peak, a
    second logits copy, the checkpointed blocks' autocast copies, and with one micro-batch the
    gradients)."""
    model = ModelConfig(size="1B", vocab_size=100352)
    parallel = ParallelConfig(param_dtype="bfloat16", compile=True, activation_checkpointing=ac)
    module = TrainModuleConfig(autocast_precision="bf16")
    est = estimate_memory(
        model, parallel, module, seq_len=4096, micro_seqs=micro, dp_shard=1, grad_accum=accum
    )
    assert -0.02 <= est.total / 2**30 / GPU_PEAKS[ac, micro, accum] - 1 <= 0.10


@pytest.mark.slow
def test_the_estimate_holds_against_a_measured_step(processes):
    """One process under bf16 autocast, eager and compiled, and two FSDP2 ranks accumulating,
    against the allocator."""
    out = processes.python("benchmarks/memory.py", "--cases", "activ.-bf16,logits-c-bf16,fsdp2")
    assert out.returncode == 0, out.stderr[-2000:]
    errors = [float(e) for e in re.findall(r"([+-]\d+\.\d)%\n", out.stdout)]
    assert len(errors) == 3 and all(abs(e) <= 25 for e in errors), out.stdout
