"""Where bf16 compute comes from: FSDP's mixed-precision policy or autocast (no torch).

``parallel.param_dtype: bfloat16`` means bf16 compute on every layout, done as fast trainers do
it. Where FSDP shards the model its ``MixedPrecisionPolicy`` gathers bf16 parameters (fp32
master weights and, with ``reduce_dtype: float32``, fp32 gradient reduction): the whole forward
is bf16 and autocast would only add casts. Where nothing shards it (one device, tensor parallel
alone) the same setting becomes bf16 autocast over fp32 weights, 2.2% faster on one GPU than
FSDP2's policy on a one-rank mesh (benchmarks/RESULTS.md, H200). An explicit
``train_module.autocast_precision`` is always honoured. The trainer builds its train module and
the planner its memory estimate from this one rule.
"""

from __future__ import annotations

from trainer_core.config.sections import ParallelConfig, TrainModuleConfig


def autocast_precision(
    parallel: ParallelConfig, train_module: TrainModuleConfig, *, fsdp: bool
) -> str | None:
    """The autocast a step runs under ("bf16" or None); ``fsdp``: FSDP wraps the model
    (data-parallel size > 1)."""
    if train_module.autocast_precision:
        return train_module.autocast_precision
    if parallel.param_dtype == "bfloat16" and not fsdp:
        return "bf16"
    return None


def computes_in_16_bit(parallel: ParallelConfig, train_module: TrainModuleConfig) -> bool:
    """True when matmuls and attention see 16-bit inputs on every layout."""
    return parallel.param_dtype == "bfloat16" or train_module.autocast_precision is not None
