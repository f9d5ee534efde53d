"""The batch/devices arithmetic on the device mesh (:mod:`trainer_core.parallel.mesh`).

The fewest devices that hold the model (memory estimate, :mod:`trainer_core.ladder.memory`)
with the largest micro-batch that fits there; then the most devices (a power of two within a
node, or whole nodes; multiples of dp_replicate x tp; at most ``max_devices``; none that would
give a data-parallel rank fewer than ``min_rank_tokens`` of the target batch) whose batch, whole
micro-batches per data-parallel rank, stays within 10% of the target (a warning otherwise); then
the largest micro-batch that fits on that final mesh, including FSDP's unsharded gradients during
accumulation, or reduced after every micro-batch where those would not fit (the plan says so).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import replace

from trainer_core.config.sections import (
    ModelConfig,
    ParallelConfig,
)
from trainer_core.ladder.config import LadderConfig, device_counts
from trainer_core.ladder.memory import MemoryEstimate, estimate_memory
from trainer_core.parallel.mesh import dp_layout, mesh_shape


def step_memory(
    model: ModelConfig, ladder: LadderConfig, devices: int, micro: int, accum: int, sync_every: bool
) -> MemoryEstimate:
    """The memory estimate of a step of ``model`` on ``devices`` (its mesh from the template)."""
    run = ladder.run
    replicate, shard, _ = mesh_shape(run.parallel, devices)
    return estimate_memory(
        model,
        run.parallel,
        replace(run.train_module, reduce_grads_every_micro_batch=sync_every),
        seq_len=ladder.seq_len,
        micro_seqs=micro,
        dp_shard=shard,
        grad_accum=accum,
    )


def min_mesh_and_micro(model: ModelConfig, ladder: LadderConfig) -> tuple[int, int]:
    """(minimum devices, micro-batch sequences on them): the fewest devices that hold the model
    with one sequence, then the largest power-of-two micro-batch that fits there."""
    budget = ladder.memory_bytes
    counts = device_counts(ladder)
    fitting = [d for d in counts if step_memory(model, ladder, d, 1, 1, True).total <= budget]
    devices = fitting[0] if fitting else 2 * counts[-1]
    micro = 1
    while (
        micro * 2 <= ladder.max_micro_batch_seqs
        and step_memory(model, ladder, devices, micro * 2, 1, True).total <= budget
    ):
        micro *= 2
    return devices, micro


DEVICE_SEARCH_LIMIT = 2**20
"""How far past ``max_devices`` :func:`fewest_devices` looks."""


def one_sequence_floor(model: ModelConfig, ladder: LadderConfig) -> MemoryEstimate:
    """The part of a one-sequence step's memory no number of devices removes: its activations and
    logits, and the parameters FSDP gathers (the sharded states, left out, shrink with the mesh)."""
    most = device_counts(ladder, DEVICE_SEARCH_LIMIT)[-1]
    estimate = step_memory(model, ladder, most, 1, 1, True)
    return replace(estimate, params=0, grads=0, optimizer=0)


def fewest_devices(model: ModelConfig, ladder: LadderConfig) -> int | None:
    """The fewest devices, by the rules of :func:`device_counts` but past ``max_devices``, that
    hold the model with one sequence per micro-batch; None where no count up to
    :data:`DEVICE_SEARCH_LIMIT` does."""
    counts = device_counts(ladder, DEVICE_SEARCH_LIMIT)

    def fits(devices: int) -> bool:
        return step_memory(model, ladder, devices, 1, 1, True).total <= ladder.memory_bytes

    if not fits(counts[-1]):
        return None
    return counts[bisect_left(counts, True, key=fits)]


def rank_token_floor(
    counts: list[int], min_devices: int, target_tokens: int, ladder: LadderConfig
) -> list[int]:
    """The counts (of ``counts``, from ``min_devices`` on) whose data-parallel ranks each get at
    least ``min_rank_tokens`` of the target batch; ``[min_devices]`` where even it gives fewer."""
    floor = ladder.min_rank_tokens
    parallel = ladder.run.parallel
    return [
        d
        for d in counts
        if d >= min_devices and target_tokens >= floor * dp_layout(parallel, d).dp_size
    ] or [min_devices]


BATCH_DRIFT = 0.1
"""How far the planned global batch may sit from the formula's target before the plan warns."""


def batch_and_devices(
    target_seqs: int,
    micro_seqs: int,
    min_devices: int,
    counts: list[int],
    parallel: ParallelConfig,
    max_drift: float = BATCH_DRIFT,
) -> tuple[int, int]:
    """(global batch in sequences, devices): the most devices (of ``counts``, from
    ``min_devices`` on) whose batch stays within ``max_drift`` of the target, each
    data-parallel rank getting whole micro-batches (or, failing that, whole sequences).
    Without such a count: the count whose batch is closest to the target."""
    fallback: tuple[float, int, int] | None = None
    for devices in sorted((d for d in counts if d >= min_devices), reverse=True):
        dp = dp_layout(parallel, devices).dp_size
        for grain in (micro_seqs, 1):
            batch = max(1, round(target_seqs / (dp * grain))) * grain * dp
            drift = abs(batch - target_seqs) / target_seqs
            if drift <= max_drift:
                return batch, devices
            if fallback is None or drift < fallback[0]:
                fallback = (drift, batch, devices)
    return fallback[1], fallback[2]


def final_micro_batch(
    model: ModelConfig, ladder: LadderConfig, devices: int, rank_seqs: int
) -> tuple[int, bool, MemoryEstimate]:
    """(micro-batch, reduce every micro-batch, its estimate) for the final mesh: the largest
    divisor of this rank's sequences that fits with FSDP's unsharded gradients, else the largest
    that fits reducing after every micro-batch (more traffic, no unsharded copy)."""
    budget = ladder.memory_bytes
    limit = min(rank_seqs, ladder.max_micro_batch_seqs)
    micros = [m for m in range(1, limit + 1) if rank_seqs % m == 0]
    for sync_every in (False, True):
        for micro in reversed(micros):
            estimate = step_memory(model, ladder, devices, micro, rank_seqs // micro, sync_every)
            if estimate.total <= budget:
                return micro, sync_every, estimate
    return 1, True, step_memory(model, ladder, devices, 1, rank_seqs, True)


def rank_batch_and_micro(
    model: ModelConfig,
    ladder: LadderConfig,
    devices: int,
    dp: int,
    target_seqs: int,
    rank_seqs: int,
    max_drift: float = BATCH_DRIFT,
) -> tuple[int, int, bool, MemoryEstimate]:
    """(sequences per rank, micro-batch, reduce every micro-batch, estimate) on the final mesh.

    The rank batch closest to the target can have few divisors (7 sequences: micro-batch 7 or 1),
    so a micro-batch that fits gets cut to 1 and the device idles at a fraction of its memory.
    When that happens, another rank batch whose global batch is still within ``max_drift`` of
    the target and allows at least twice the micro-batch is taken
    instead (the nearest to the target of those with the largest micro-batch).
    """
    micro, sync_every, estimate = final_micro_batch(model, ladder, devices, rank_seqs)
    if micro == rank_seqs:
        return rank_seqs, micro, sync_every, estimate
    best = (micro, 0.0, rank_seqs, sync_every, estimate)
    low = math.ceil(target_seqs * (1 - max_drift) / dp)
    high = math.floor(target_seqs * (1 + max_drift) / dp)
    for seqs in range(max(low, 1), high + 1):
        m, every, est = final_micro_batch(model, ladder, devices, seqs)
        drift = abs(seqs * dp - target_seqs) / target_seqs
        if m >= 2 * micro and (m, -drift) > best[:2]:
            best = (m, -drift, seqs, every, est)
    m, _, seqs, every, est = best
    return seqs, m, every, est
