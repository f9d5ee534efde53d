"""``parallel.param_dtype: bfloat16`` gives bf16 compute on every layout: FSDP2's
MixedPrecisionPolicy where FSDP shards (no autocast), bf16 autocast where nothing does."""

from __future__ import annotations

import json

import pytest
from spawned_build import SHORT, observe, rank_worker

from trainer_core.config.sections import ModelConfig, ParallelConfig, TrainModuleConfig
from trainer_core.ladder.memory import estimate_memory
from trainer_core.parallel.precision import autocast_precision

BF16 = ParallelConfig(param_dtype="bfloat16")


@pytest.mark.parametrize(
    "parallel, module, fsdp, expected",
    [
        (BF16, TrainModuleConfig(), False, "bf16"),  # one device / TP alone: autocast
        (BF16, TrainModuleConfig(), True, None),  # FSDP's policy casts the parameters
        (ParallelConfig(), TrainModuleConfig(), False, None),  # fp32
        (ParallelConfig(), TrainModuleConfig(), True, None),
        (ParallelConfig(), TrainModuleConfig(autocast_precision="bf16"), True, "bf16"),  # wins
        (ParallelConfig(), TrainModuleConfig(autocast_precision="bf16"), False, "bf16"),
    ],
)
def test_where_bf16_comes_from(parallel, module, fsdp, expected):
    assert autocast_precision(parallel, module, fsdp=fsdp) == expected


def test_the_memory_estimate_follows_the_same_rule():
    """bf16 without FSDP is autocast; with FSDP it is bf16 parameters, whose norms and RoPE
    still save fp32 copies: 0.8x of fp32's activations either way (``trainer_core.ladder.memory``)."""
    model = ModelConfig(size="1B", vocab_size=50304)
    args = {"seq_len": 4096, "micro_seqs": 2, "grad_accum": 1}

    def estimate(parallel, module=None, dp_shard=1):
        module = module or TrainModuleConfig()
        return estimate_memory(model, parallel, module, dp_shard=dp_shard, **args)

    autocast = estimate(ParallelConfig(), TrainModuleConfig(autocast_precision="bf16"))
    one_device = estimate(BF16)
    assert (one_device.activations, one_device.logits) == (autocast.activations, autocast.logits)
    replicated = estimate(ParallelConfig(param_dtype="bfloat16", dp_replicate=2))
    sharded = estimate(BF16, dp_shard=2)
    fp32 = estimate(ParallelConfig(), dp_shard=2)
    assert replicated.activations == sharded.activations == pytest.approx(0.8 * fp32.activations)


@pytest.mark.slow
def test_one_device_bf16_is_autocast_over_fp32_weights(tmp_path):
    seen = observe([*SHORT, "--parallel.param_dtype=bfloat16", f"--trainer.run_dir={tmp_path}"])
    assert seen["autocast"] == "torch.bfloat16"
    # the residual stream stays fp32; autocast runs the matmul in bf16
    assert (seen["linear_input"], seen["linear_output"]) == ("torch.float32", "torch.bfloat16")
    assert seen["params"] == seen["grads"] == ["torch.float32"]


@pytest.mark.slow
def test_fsdp_bf16_is_the_mixed_precision_policy_not_autocast(spawn_ranks, tmp_path):
    """2 FSDP2 ranks: no autocast, the block computes on bf16 inputs with bf16 gathered weights,
    while the sharded parameters and their (fp32-reduced) gradients stay fp32."""
    out = tmp_path / "result.json"
    overrides = [*SHORT, "--parallel.param_dtype=bfloat16", "--parallel.reduce_dtype=float32"]
    spawn_ranks(rank_worker, 2, overrides, str(out))
    seen = json.loads(out.read_text())
    assert seen["autocast"] == "None"
    assert (seen["linear_input"], seen["linear_output"]) == ("torch.bfloat16", "torch.bfloat16")
    assert seen["params"] == seen["grads"] == ["torch.float32"]
