"""The memory estimate: each term responds to what changes it, and it holds against a real step."""

from __future__ import annotations

import re

import pytest

from trainer_core.config import ModelConfig, ParallelConfig, TrainModuleConfig
from trainer_core.memory import estimate_memory

MODEL = ModelConfig(size="1B", vocab_size=50304)


PARALLEL, MODULE = ParallelConfig(), TrainModuleConfig()


def estimate(parallel=PARALLEL, module=MODULE, **kw):
    args = {"seq_len": 4096, "micro_seqs": 2, "dp_shard": 8, "grad_accum": 4, **kw}
    return estimate_memory(MODEL, parallel, module, **args)


def test_terms_follow_sharding_accumulation_checkpointing_and_precision():
    base = estimate()
    assert estimate(dp_shard=16).params == pytest.approx(base.params / 2)
    assert estimate(parallel=ParallelConfig(tp=2)).params == pytest.approx(base.params / 2)
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
    assert autocast.logits > base.logits  # the 16-bit logits come on top of the fp32 ones
    bf16 = estimate(parallel=ParallelConfig(param_dtype="bfloat16"))
    assert bf16.activations == pytest.approx(0.5 * base.activations)
    assert base.total == pytest.approx(
        base.params
        + base.grads
        + base.optimizer
        + base.unsharded_grads
        + base.activations
        + base.logits
    )


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


@pytest.mark.slow
def test_the_estimate_holds_against_a_measured_step(processes):
    out = processes.python(
        "benchmarks/memory.py", "--sizes", "5M", "--micro", "4", "--seq-len", "256"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    errors = [float(e) for e in re.findall(r"([+-]\d+\.\d)%\n", out.stdout)]
    assert len(errors) == 2 and all(abs(e) <= 25 for e in errors), out.stdout
