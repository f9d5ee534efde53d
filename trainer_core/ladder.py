"""Ladder planning: from a list of sizes to one fully specified training run per size (no Ray).

Default formulas follow OLMo-core's model ladder (``olmo_core.model_ladder``, 2025): N counts every
parameter except the input embedding; target batch = 2048*160*(N/108e6)^(2/3) tokens; peak LR =
0.0047*(N/108e6)^(-1/3)/2; warmup = N tokens; AdamW, weight decay 0.1, beta2 0.95 for batches of
>= 524,288 tokens else 0.99; duration = 20*N*c tokens under WSD-S, whose decays (the last 10% of
each period) end at 1/8, 1/4, 1/2 and 1 of the run (0.5x, 1x, 2x, 4x Chinchilla for c = 4), with
permanent checkpoints + evals just before and after every decay, so one run gives points at
several Chinchilla multiples. Every formula is a field a config can override.

A plan's output is the run itself: each size's :class:`TrainConfig`, the ladder's ``run``
template with the planned fields filled in by ``dataclasses.replace``. A template field the plan
fills in (:data:`PLANNED`) is an error to set, so no setting is silently replaced.

The batch/devices arithmetic works on the device mesh (:mod:`trainer_core.mesh`): the fewest
devices that hold the model (memory estimate, :mod:`trainer_core.memory`) with the largest
micro-batch that fits there; then the most devices (a power of two within a node, or whole
nodes; multiples of dp_replicate x tp; at most ``max_devices``) whose batch, whole micro-batches
per data-parallel rank, stays within 10% of the target (a warning otherwise); then the largest
micro-batch that fits on that final mesh, including FSDP's unsharded gradients during
accumulation, or reduced after every micro-batch where those would not fit (the plan says so).

Warmup is N tokens but at most a tenth of the run: at short durations (small multiples, large
batches) the cap binds, and the dry run shows both numbers.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import ClassVar

import yaml

from trainer_core import storage
from trainer_core.config import (
    SIZE_DIMS,
    ModelConfig,
    ParallelConfig,
    ScheduleConfig,
    TrainConfig,
    require,
)
from trainer_core.configio import ConfigError, to_yaml
from trainer_core.data import open_token_data
from trainer_core.errors import UserError
from trainer_core.flops import PEAK_BF16_FLOPS, device_peak_flops, match_device
from trainer_core.memory import MemoryEstimate, estimate_memory
from trainer_core.mesh import check_tensor_parallel, dp_layout, mesh_shape
from trainer_core.model import count_params, num_flops_per_token
from trainer_core.paths import check_output_dir
from trainer_core.run_dir import EXPERIMENT, PLAN, RUNS
from trainer_core.schedule import decay_windows, wsds_schedule
from trainer_core.sizes import check_size
from trainer_core.storage import Location, write_atomic

# Accelerator memory (GiB) by model name in the device type (matched as :func:`match_device`
# does); "cpu" is a working-set budget.
DEVICE_MEMORY_GB = {
    "B200": 180,
    "H200": 141,
    "GH200": 96,
    "H100 NVL": 94,
    "H100": 80,
    "A100": 80,
    "L40S": 48,
    "L40": 48,
    "A10G": 24,
    "L4": 24,
    "cpu": 16,
}
CPU_NOMINAL_FLOPS = 1e11
"""A CPU ladder's device-hours use a nominal 2-core figure (its MFU is measured, not looked up)."""


@dataclass
class BatchFormula:
    """Target global batch in tokens: ``coef * (N / ref_params) ** exponent``."""

    coef: float = 2048 * 160
    ref_params: float = 108e6
    exponent: float = 2 / 3


LADDER_LR_EXPONENT = -1 / 3
"""OLMo-core's peak LR ~ N^(-1/3): the ladder's default, and the analysis's reference for a fit."""


@dataclass
class LRFormula:
    """Peak LR ``coef * (N / ref_params) ** exponent``, or fitted by an LR sweep (``from_sweep``)."""

    coef: float = 0.0047 / 2
    ref_params: float = 108e6
    exponent: float = LADDER_LR_EXPONENT
    from_sweep: str = ""
    """An LR-sweep experiment dir: use its fitted LR*(N) = a * N^b for every size."""


@dataclass
class DurationFormula:
    """How long each size trains and how its LR schedule is shaped."""

    tokens_per_param: float = 20.0
    """Chinchilla-optimal tokens per parameter."""
    chinchilla_multiple: float = 4.0
    """c: each run trains 20*N*c tokens (a power of two, e.g. 4, 1, 0.25)."""
    warmup_tokens_per_param: float = 1.0
    schedule: str = "wsds"
    """'wsds' (decays ending at each decay point) or 'cosine' (one decay to the end)."""
    decay_points: list[float] = field(default_factory=lambda: [0.125, 0.25, 0.5, 1.0])
    """Where WSD-S decays end, as fractions of the run."""
    decay_fraction: float = 0.1
    min_lr_ratio: float = 0.0
    multiple_by_size: dict[str, float] = field(default_factory=dict)
    """Per-size c overriding ``chinchilla_multiple`` (e.g. ``{25K: 8}``): training the cheap small
    sizes longer gives them annealed points at the budgets of the larger ones, so isoFLOP
    (approach 2) budgets are covered by several sizes for little extra compute."""

    def __post_init__(self) -> None:
        multiples = {"chinchilla_multiple": self.chinchilla_multiple}
        multiples.update({f"multiple_by_size.{k}": v for k, v in self.multiple_by_size.items()})
        for key, c in multiples.items():
            require(c > 0 and math.log2(c).is_integer(), key, c, "must be a power of two")
        for size in self.multiple_by_size:
            check_size(size, "multiple_by_size")
        require(
            self.schedule in ("wsds", "cosine"), "schedule", self.schedule, "use 'wsds' or 'cosine'"
        )
        pts = self.decay_points
        require(
            bool(pts) and pts == sorted(pts) and pts[0] > 0 and pts[-1] == 1.0,
            "decay_points",
            pts,
            "must increase and end at 1.0",
        )
        require(
            0 < self.decay_fraction < 1, "decay_fraction", self.decay_fraction, "must be in (0, 1)"
        )


@dataclass
class Beta2Formula:
    """AdamW's beta2 by global batch: ``large_batch`` from ``large_batch_tokens`` on."""

    large_batch: float = 0.95
    small_batch: float = 0.99
    large_batch_tokens: int = 524_288


@dataclass
class LadderConfig:
    """A model ladder: named sizes, the formulas that size everything, and the run template.

    What planning reads (sizes, sequence length, vocabulary, devices, formulas) is set here;
    every other setting of the runs is set in ``run``.
    """

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "seed": "run.trainer.seed",
        "data": "run.data",
        "tracking": "run.tracking",
        "optim": "run.optim (beta1, weight_decay) and beta2 (the batch-size rule for beta2)",
    }
    """Keys of older ladder files and where each fact lives now (named in the error)."""

    name: str = "demo"
    dir: str = "runs/ladder-demo"
    sizes: list[str] = field(default_factory=lambda: ["1M", "3M", "5M"])
    max_devices: int = 1
    device_type: str = "cpu"
    devices_per_node: int = 8
    """A run's devices are a power of two within one node, or whole nodes (the mesh keeps a TP
    group inside a node; partial nodes strand the rest)."""
    device_memory_gb: float | None = None
    memory_fraction: float = 0.8
    max_micro_batch_seqs: int = 64
    assumed_mfu: float = 0.4
    """For the device-hours estimate (measure it with ``--benchmark SIZE``)."""
    seq_len: int = 128
    vocab_size: int = 320
    eval_tokens: int = 0
    """Tokens per evaluation, the same for every size (rounded to whole batches); 0 = the run
    template's ``trainer.eval_batches``. Equal eval sets keep the sizes' losses comparable."""
    batch: BatchFormula = field(default_factory=BatchFormula)
    lr: LRFormula = field(default_factory=LRFormula)
    duration: DurationFormula = field(default_factory=DurationFormula)
    beta2: Beta2Formula = field(default_factory=Beta2Formula)
    run: TrainConfig = field(default_factory=TrainConfig)
    """Template for every run (data, seed, optimizer, logging, eval, precision, parallelism,
    tracking...); the fields in :data:`PLANNED` are filled in per size, so left unset here."""

    def __post_init__(self) -> None:
        require(bool(self.sizes), "sizes", self.sizes, "list at least one size")
        for s in self.sizes:
            check_size(s, "sizes")
        require(self.max_devices >= 1, "max_devices", self.max_devices, "must be >= 1")
        require(
            self.devices_per_node >= 1, "devices_per_node", self.devices_per_node, "must be >= 1"
        )
        parallel = self.run.parallel
        require(
            parallel.dp_shard == -1,
            "run.parallel.dp_shard",
            parallel.dp_shard,
            "the ladder sizes the mesh per size: leave it -1 (every device not used by "
            "dp_replicate and tp)",
        )
        group = parallel.tp * parallel.dp_replicate
        require(
            self.devices_per_node % parallel.tp == 0,
            "run.parallel.tp",
            parallel.tp,
            f"a TP group stays inside a node: must divide devices_per_node={self.devices_per_node}",
        )
        require(
            bool(device_counts(self)),
            "max_devices",
            self.max_devices,
            f"no run fits: devices must be a multiple of dp_replicate x tp = {group} and a power "
            f"of two within a node or whole nodes of {self.devices_per_node}",
        )
        require(
            not self.uses_gpu or device_peak_flops(self.device_type) is not None,
            "device_type",
            self.device_type,
            f"use 'cpu' or a GPU of trainer_core.flops.PEAK_BF16_FLOPS ({', '.join(PEAK_BF16_FLOPS)})",
        )
        require(
            0 < self.memory_fraction <= 1,
            "memory_fraction",
            self.memory_fraction,
            "must be in (0, 1]",
        )
        planned = dict(PLANNED)
        if self.eval_tokens:
            planned["trainer.eval_batches"] = "eval_tokens"
        check_unplanned(self.run, TrainConfig(), planned, "run.")

    @property
    def memory_bytes(self) -> float:
        gb = self.device_memory_gb or _lookup(DEVICE_MEMORY_GB, self.device_type, 80)
        return gb * 2**30 * self.memory_fraction

    @property
    def peak_flops(self) -> float:
        """Per device, from the one table MFU uses too (:mod:`trainer_core.flops`)."""
        if not self.uses_gpu:
            return CPU_NOMINAL_FLOPS
        return device_peak_flops(self.device_type)

    @property
    def uses_gpu(self) -> bool:
        return self.device_type.lower() != "cpu"


PLANNED = {
    **{f"model.{key}": "sizes" for key in ("size", *SIZE_DIMS)},
    "model.vocab_size": "vocab_size",
    "data.seq_len": "seq_len",
    "optim.lr": "lr",
    "optim.beta2": "beta2",
    "schedule": "duration",
    "train_module.rank_microbatch_seqs": "max_micro_batch_seqs",
    "train_module.reduce_grads_every_micro_batch": "memory_fraction",
    "trainer.run_dir": "dir",
    "trainer.global_batch_size": "batch",
    "trainer.max_steps": "duration",
    "trainer.max_tokens": "duration",
    "trainer.device": "device_type",
    "checkpoint.keep_steps": "duration.decay_points",
    "tracking.group": "name",
    "tracking.name": "name",
}
"""Each run-template field the plan fills in -> the ladder key it is planned from."""


def check_unplanned(
    template: object, default: object, planned: dict[str, str], prefix: str
) -> None:
    """Fail, naming both keys, when ``template`` sets (differs from ``default`` in) a field the
    plan fills in: the plan would replace the value without a word."""
    for key, owner in planned.items():
        if attrgetter(key)(template) != attrgetter(key)(default):
            raise ConfigError(
                f"{prefix}{key}: the ladder plans it from {owner} for every size; "
                f"remove {prefix}{key} (or set {owner})"
            )


def _lookup(table: dict[str, float], device_type: str, default: float) -> float:
    """The entry of the model named in ``device_type`` (:func:`match_device`), else ``default``."""
    key = match_device(device_type, table)
    return default if key is None else table[key]


# -- the formulas (each a named function so a reader can find and test it) ------------------------


def target_batch_tokens(n: int, f: BatchFormula) -> int:
    return round(f.coef * (n / f.ref_params) ** f.exponent)


def peak_lr(n: int, f: LRFormula) -> float:
    return f.coef * (n / f.ref_params) ** f.exponent


def chinchilla_multiple(size: str, f: DurationFormula) -> float:
    return f.multiple_by_size.get(size, f.chinchilla_multiple)


def train_tokens(n: int, multiple: float, f: DurationFormula) -> int:
    return round(f.tokens_per_param * n * multiple)


def beta2_for_batch(batch_tokens: int, f: Beta2Formula) -> float:
    return f.large_batch if batch_tokens >= f.large_batch_tokens else f.small_batch


@dataclass
class SizePlan:
    """Everything decided for one size: its run and the numbers behind it (``table_row`` is
    what ``--dry-run`` prints). What the run's config holds is read from there, not copied."""

    size: str
    num_params: int
    target_batch_tokens: int
    devices: int
    mesh: tuple[int, int, int]
    """(dp_replicate, dp_shard, tp)."""
    grad_accum: int
    memory: MemoryEstimate
    """Per device, for the planned micro-batch and accumulation."""
    uncapped_warmup: int
    """The warmup formula's steps before the cap of a tenth of the run."""
    lr_source: str
    flops_per_token: int
    chinchilla_multiple: float
    config: TrainConfig
    """The size's run, named after the size (see :func:`named_run`)."""
    batch_warning: str = ""

    @property
    def model(self) -> ModelConfig:
        return self.config.model

    @property
    def lr(self) -> float:
        return self.config.optim.lr

    @property
    def schedule(self) -> ScheduleConfig:
        return self.config.schedule

    @property
    def steps(self) -> int:
        return self.config.total_steps

    @property
    def batch_tokens(self) -> int:
        return self.config.trainer.global_batch_size

    @property
    def batch_seqs(self) -> int:
        return self.batch_tokens // self.config.data.seq_len

    @property
    def dp_size(self) -> int:
        return self.mesh[0] * self.mesh[1]

    @property
    def micro_batch_seqs(self) -> int:
        return self.config.train_module.rank_microbatch_seqs

    @property
    def warmup_steps(self) -> int:
        return int(self.schedule.warmup)

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_tokens

    @property
    def checkpoint_steps(self) -> list[int]:
        return self.config.checkpoint.keep_steps

    @property
    def eval_batches(self) -> int:
        return self.config.trainer.eval_batches

    @property
    def total_flops(self) -> float:
        return float(self.flops_per_token) * self.steps * self.batch_tokens

    def device_hours(self, ladder: LadderConfig) -> float:
        return self.total_flops / (ladder.peak_flops * ladder.assumed_mfu) / 3600

    def table_row(self, ladder: LadderConfig) -> dict[str, object]:
        m = self.model
        return {
            "size": self.size,
            "N": self.num_params,
            "layers/d/heads": f"{m.n_layers}/{m.d_model}/{m.n_heads}",
            "target batch": self.target_batch_tokens,
            "batch tokens": self.batch_tokens,
            "batch seqs": self.batch_seqs,
            "micro seqs": self.micro_batch_seqs,
            "devices": self.devices,
            "mesh r/s/tp": "/".join(map(str, self.mesh)),
            "dp": self.dp_size,
            "accum": self.grad_accum,
            "grad reduce": (
                "every micro"
                if self.config.train_module.reduce_grads_every_micro_batch
                else "per step"
            ),
            "mem GiB": round(self.memory.total / 2**30, 2),
            "headroom": f"{100 * (1 - self.memory.total / ladder.memory_bytes):.0f}%",
            "peak lr": self.lr,
            "warmup": (
                f"{self.warmup_steps} (cap; formula {self.uncapped_warmup})"
                if self.warmup_steps < self.uncapped_warmup
                else self.warmup_steps
            ),
            "tokens": self.tokens,
            "x Chinchilla": self.chinchilla_multiple,
            "steps": self.steps,
            "ckpt steps": ",".join(map(str, self.checkpoint_steps)),
            "FLOPs": self.total_flops,
            "device-h": self.device_hours(ladder),
        }


def device_counts(ladder: LadderConfig) -> list[int]:
    """Device counts a run may use, ascending: multiples of dp_replicate x tp that are a power of
    two within one node or whole nodes, up to ``max_devices``."""
    group = ladder.run.parallel.tp * ladder.run.parallel.dp_replicate
    node = ladder.devices_per_node
    within = [2**k for k in range(node.bit_length()) if 2**k <= node and node % 2**k == 0]
    counts = set(within) | set(range(node, ladder.max_devices + 1, node))
    return sorted(d for d in counts if d <= ladder.max_devices and d % group == 0)


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


BATCH_DRIFT = 0.1
"""How far the planned global batch may sit from the formula's target before the plan warns."""


def batch_and_devices(
    target_seqs: int, micro_seqs: int, min_devices: int, counts: list[int], parallel: ParallelConfig
) -> tuple[int, int]:
    """(global batch in sequences, devices): the most devices (of ``counts``, from
    ``min_devices`` on) whose batch stays within :data:`BATCH_DRIFT` of the target, each
    data-parallel rank getting whole micro-batches (or, failing that, whole sequences).
    Without such a count: the count whose batch is closest to the target."""
    fallback: tuple[float, int, int] | None = None
    for devices in sorted((d for d in counts if d >= min_devices), reverse=True):
        dp = dp_layout(parallel, devices).dp_size
        for grain in (micro_seqs, 1):
            batch = max(1, round(target_seqs / (dp * grain))) * grain * dp
            drift = abs(batch - target_seqs) / target_seqs
            if drift <= BATCH_DRIFT:
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
) -> tuple[int, int, bool, MemoryEstimate]:
    """(sequences per rank, micro-batch, reduce every micro-batch, estimate) on the final mesh.

    The rank batch closest to the target can have few divisors (7 sequences: micro-batch 7 or 1),
    so a micro-batch that fits gets cut to 1 and the device idles at a fraction of its memory.
    When that happens, another rank batch whose global batch is still within
    :data:`BATCH_DRIFT` of the target and allows at least twice the micro-batch is taken
    instead (the nearest to the target of those with the largest micro-batch).
    """
    micro, sync_every, estimate = final_micro_batch(model, ladder, devices, rank_seqs)
    if micro == rank_seqs:
        return rank_seqs, micro, sync_every, estimate
    best = (micro, 0.0, rank_seqs, sync_every, estimate)
    low = math.ceil(target_seqs * (1 - BATCH_DRIFT) / dp)
    high = math.floor(target_seqs * (1 + BATCH_DRIFT) / dp)
    for seqs in range(max(low, 1), high + 1):
        m, every, est = final_micro_batch(model, ladder, devices, seqs)
        drift = abs(seqs * dp - target_seqs) / target_seqs
        if m >= 2 * micro and (m, -drift) > best[:2]:
            best = (m, -drift, seqs, every, est)
    m, _, seqs, every, est = best
    return seqs, m, every, est


def plan_size(size: str, ladder: LadderConfig, lr_fn=None) -> SizePlan:
    run = ladder.run
    model = replace(
        run.model, size=size, vocab_size=ladder.vocab_size, **dict.fromkeys(SIZE_DIMS, 0)
    )
    n = count_params(model)["non_embedding"]
    seq = ladder.seq_len
    tp = run.parallel.tp
    try:
        check_tensor_parallel(model, tp)
    except ConfigError as e:
        raise ConfigError(f"run.{e} (or drop size {size!r})") from None
    min_devices, micro_seqs = min_mesh_and_micro(model, ladder)
    if min_devices > ladder.max_devices:
        raise ConfigError(
            f"sizes: {size!r} needs more than {ladder.max_devices} devices of "
            f"{ladder.device_type} (memory estimate); raise max_devices, turn on activation "
            "checkpointing, or drop this size"
        )
    target = target_batch_tokens(n, ladder.batch)
    batch_seqs, devices = batch_and_devices(
        max(1, round(target / seq)), micro_seqs, min_devices, device_counts(ladder), run.parallel
    )
    batch = batch_seqs * seq
    layout = dp_layout(run.parallel, devices)
    rank_seqs, micro_seqs, sync_every, memory = rank_batch_and_micro(
        model,
        ladder,
        devices,
        layout.dp_size,
        max(1, round(target / seq)),
        batch_seqs // layout.dp_size,
    )
    batch = rank_seqs * layout.dp_size * seq
    if memory.total > ladder.memory_bytes:
        raise ConfigError(
            f"sizes: {size!r} does not fit on {devices} {ladder.device_type} with one sequence "
            f"per micro-batch ({memory.total / 2**30:.1f} GiB estimated, "
            f"{ladder.memory_bytes / 2**30:.1f} GiB usable); raise max_devices or turn on "
            "activation checkpointing"
        )
    accum = rank_seqs // micro_seqs
    drift = abs(batch - target) / target
    warning = ""
    if drift > BATCH_DRIFT:
        warning = (
            f"{size}: global batch {batch:,} tokens differs from the target {target:,} by "
            f"{100 * drift:.0f}%"
        )
        warnings.warn(warning, stacklevel=2)
    multiple = chinchilla_multiple(size, ladder.duration)
    tokens_target = train_tokens(n, multiple, ladder.duration)
    steps = max(1, math.ceil(tokens_target / batch))
    uncapped_warmup = max(1, round(ladder.duration.warmup_tokens_per_param * n / batch))
    warmup = min(uncapped_warmup, max(1, steps // 10))
    schedule, ckpt_steps = _schedule_and_checkpoints(steps, warmup, ladder.duration)
    lr, source = (
        (lr_fn(n), f"sweep {ladder.lr.from_sweep}") if lr_fn else (peak_lr(n, ladder.lr), "formula")
    )
    config = replace(
        run,
        model=model,
        data=replace(run.data, seq_len=seq),
        optim=replace(run.optim, lr=lr, beta2=beta2_for_batch(batch, ladder.beta2)),
        schedule=schedule,
        train_module=replace(
            run.train_module,
            rank_microbatch_seqs=micro_seqs,
            reduce_grads_every_micro_batch=sync_every,
        ),
        trainer=replace(
            run.trainer,
            global_batch_size=batch,
            max_steps=steps,
            max_tokens=None,
            eval_batches=(
                max(1, round(ladder.eval_tokens / batch))
                if ladder.eval_tokens
                else run.trainer.eval_batches
            ),
            device="cuda" if ladder.uses_gpu else "cpu",
        ),
        checkpoint=replace(run.checkpoint, keep_steps=ckpt_steps),
        tracking=replace(
            run.tracking,
            project=run.tracking.project or ladder.name,
            group=ladder.name,
            tags=[*run.tracking.tags, f"lr_source={source}"],
        ),
    )
    return SizePlan(
        size=size,
        num_params=n,
        target_batch_tokens=target,
        devices=devices,
        mesh=mesh_shape(run.parallel, devices),
        grad_accum=accum,
        memory=memory,
        uncapped_warmup=uncapped_warmup,
        lr_source=source,
        flops_per_token=num_flops_per_token(model, seq),
        chinchilla_multiple=multiple,
        config=named_run(config, ladder, size),
        batch_warning=warning,
    )


def _schedule_and_checkpoints(
    steps: int, warmup: int, f: DurationFormula
) -> tuple[ScheduleConfig, list[int]]:
    if f.schedule == "cosine":
        cfg = ScheduleConfig(kind="cosine", warmup=warmup, min_lr_ratio=f.min_lr_ratio)
        return cfg, [steps]
    ends = sorted({max(1, round(p * steps)) for p in f.decay_points})
    cfg = wsds_schedule(
        ends, decay_fraction=f.decay_fraction, warmup_steps=warmup, min_lr_ratio=f.min_lr_ratio
    )
    points: set[int] = set()
    for start, end in decay_windows(steps, cfg):
        points.update({start, end})
    return cfg, sorted(p for p in points if 0 < p <= steps)


def plan_ladder(ladder: LadderConfig, sizes: list[str] | None = None, lr_fn=None) -> list[SizePlan]:
    """Plans for the given sizes; batch-drift warnings are kept on each plan (``batch_warning``)."""
    for s in sizes or []:
        check_size(s, "sizes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [plan_size(s, ladder, lr_fn) for s in sizes or ladder.sizes]


def named_run(cfg: TrainConfig, ladder: LadderConfig, run_name: str) -> TrainConfig:
    """``cfg`` as the ladder's run ``run_name``: its dir under ``<dir>/runs``, its W&B name."""
    return replace(
        cfg,
        trainer=replace(
            cfg.trainer,
            run_dir=str(storage.join(storage.normalize(ladder.dir, absolute=True), RUNS, run_name)),
        ),
        tracking=replace(cfg.tracking, name=f"{ladder.name}-{run_name}"),
    )


def experiment_kind(record: Mapping) -> str:
    """The one rule for "ladder" vs "LR sweep", on an experiment's top-level config keys (a
    job's fields, or its ``experiment.yaml``): an LR sweep's config has a ``sweep`` section."""
    return "LR sweep" if "sweep" in record else "ladder"


def recorded_experiment_kind(exp_dir: Location) -> str | None:
    """:func:`experiment_kind` of the experiment recorded in ``exp_dir``; None without a record
    (a new dir, a single run's dir)."""
    path = storage.join(exp_dir, EXPERIMENT)
    if not storage.is_file(path):
        return None
    return experiment_kind(yaml.safe_load(storage.read_text(path)) or {})


def preflight(job: LadderConfig, dry_run: bool = False) -> list[str]:
    """Fail before any trial starts: unreadable data / tokenizer mismatch, unwritable output dir,
    or a dir that already holds the other kind of experiment, whose runs and Tune state this one
    would mix with.

    A dry run plans from the config alone (the data and the dir may live on a cluster this
    machine cannot see): it returns those problems as warnings instead, and a launch still stops.
    """
    problems = []
    for check in (
        lambda: open_token_data(job.run.data, job.vocab_size),
        lambda: check_output_dir(job.dir, "dir"),
    ):
        try:
            check()
        except UserError as e:
            if not dry_run:
                raise
            problems.append(f"{e} (planned from the config; a launch stops here)")
    out = storage.normalize(job.dir)
    found = recorded_experiment_kind(out)
    kind = experiment_kind(vars(job))
    if found not in (None, kind):
        raise ConfigError(
            f"dir: {str(out)!r} already holds a different experiment ({found}, see its "
            f"experiment.yaml); this {kind} would mix its runs with that one's: pick another --dir"
        )
    return problems


def write_experiment_record(job: LadderConfig, plans: list[SizePlan], exp_dir: Location) -> None:
    storage.makedirs(exp_dir)
    write_atomic(storage.join(exp_dir, EXPERIMENT), to_yaml(job))
    rows = [{**p.table_row(job), "lr_source": p.lr_source} for p in plans]
    write_atomic(storage.join(exp_dir, PLAN), json.dumps(rows, indent=2, default=str))
