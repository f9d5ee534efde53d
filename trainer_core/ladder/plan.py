"""Planning a ladder: from a list of sizes to one fully specified training run per size.

A plan's output is the run itself: each size's :class:`TrainConfig`, the ladder's ``run``
template with the planned fields filled in by ``dataclasses.replace``. Under WSD-S the decays
(the last 10% of each period) end at 1/8, 1/4, 1/2 and 1 of the run, with permanent checkpoints
and evals just before and after every decay, so one run gives points at several Chinchilla
multiples. Warmup is N tokens but at most a tenth of the run: at short durations the cap binds,
and the dry run shows both numbers.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import (
    SIZE_DIMS,
    ModelConfig,
    ScheduleConfig,
    TrainConfig,
)
from trainer_core.config.sizes import check_size
from trainer_core.io import storage
from trainer_core.io.run_dir import RUNS
from trainer_core.ladder.batch import (
    BATCH_DRIFT,
    batch_and_devices,
    min_mesh_and_micro,
    rank_batch_and_micro,
)
from trainer_core.ladder.config import LadderConfig, device_counts
from trainer_core.ladder.formulas import (
    DurationFormula,
    beta2_for_batch,
    chinchilla_multiple,
    peak_lr,
    target_batch_tokens,
    train_tokens,
)
from trainer_core.ladder.memory import MemoryEstimate
from trainer_core.model.counts import count_params, num_flops_per_token
from trainer_core.parallel.mesh import check_tensor_parallel, dp_layout, mesh_shape
from trainer_core.train.schedule import decay_windows, wsds_schedule


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
        return self.config.batch_seqs

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


def plan_size(size: str, ladder: LadderConfig, lr_fn=None) -> SizePlan:
    """One size's run, fully specified: the ladder's ``run`` template with the model, batch,
    devices, micro-batch, LR, beta2, duration, schedule and permanent checkpoints filled in.

    The order matters: memory decides the smallest mesh and micro-batch, the target batch then
    picks the device count, and only the final mesh fixes the micro-batch and the batch (whole
    micro-batches per rank); duration, warmup and the schedule follow from that batch. ``lr_fn``
    (N -> peak LR) replaces the LR formula, e.g. a fitted LR sweep.
    """
    run = ladder.run
    model = replace(
        run.model, size=size, vocab_size=ladder.vocab_size, **dict.fromkeys(SIZE_DIMS, 0)
    )
    n = count_params(model)["non_embedding"]
    try:
        check_tensor_parallel(model, run.parallel.tp)
    except ConfigError as e:
        raise ConfigError(f"run.{e} (or drop size {size!r})") from None
    target = target_batch_tokens(n, ladder.batch)
    mesh = _mesh_and_batch(size, model, ladder, target)
    batch = mesh.batch_tokens
    multiple = chinchilla_multiple(size, ladder.duration)
    steps = max(1, math.ceil(train_tokens(n, multiple, ladder.duration) / batch))
    uncapped_warmup = max(1, round(ladder.duration.warmup_tokens_per_param * n / batch))
    warmup = min(uncapped_warmup, max(1, steps // 10))
    schedule, ckpt_steps = _schedule_and_checkpoints(steps, warmup, ladder.duration)
    lr, source = (
        (lr_fn(n), f"sweep {ladder.lr.from_sweep}") if lr_fn else (peak_lr(n, ladder.lr), "formula")
    )
    config = replace(
        run,
        model=model,
        data=replace(run.data, seq_len=ladder.seq_len),
        optim=replace(run.optim, lr=lr, beta2=beta2_for_batch(batch, ladder.beta2)),
        schedule=schedule,
        train_module=replace(
            run.train_module,
            rank_microbatch_seqs=mesh.micro_seqs,
            reduce_grads_every_micro_batch=mesh.sync_every,
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
        devices=mesh.devices,
        mesh=mesh_shape(run.parallel, mesh.devices),
        grad_accum=mesh.rank_seqs // mesh.micro_seqs,
        memory=mesh.memory,
        uncapped_warmup=uncapped_warmup,
        lr_source=source,
        flops_per_token=num_flops_per_token(model, ladder.seq_len),
        chinchilla_multiple=multiple,
        config=named_run(config, ladder, size),
        batch_warning=mesh.warning,
    )


@dataclass(frozen=True)
class _MeshPlan:
    devices: int
    rank_seqs: int
    micro_seqs: int
    sync_every: bool
    memory: MemoryEstimate
    batch_tokens: int
    warning: str


def _mesh_and_batch(size: str, model: ModelConfig, ladder: LadderConfig, target: int) -> _MeshPlan:
    """Devices, per-rank batch and micro-batch for one size (see :mod:`trainer_core.ladder.batch`),
    or a ConfigError when the model does not fit ``max_devices``."""
    seq = ladder.seq_len
    min_devices, micro_seqs = min_mesh_and_micro(model, ladder)
    if min_devices > ladder.max_devices:
        raise ConfigError(
            f"sizes: {size!r} needs more than {ladder.max_devices} devices of "
            f"{ladder.device_type} (memory estimate); raise max_devices, turn on activation "
            "checkpointing, or drop this size"
        )
    target_seqs = max(1, round(target / seq))
    batch_seqs, devices = batch_and_devices(
        target_seqs, micro_seqs, min_devices, device_counts(ladder), ladder.run.parallel
    )
    dp_size = dp_layout(ladder.run.parallel, devices).dp_size
    rank_seqs, micro_seqs, sync_every, memory = rank_batch_and_micro(
        model, ladder, devices, dp_size, target_seqs, batch_seqs // dp_size
    )
    if memory.total > ladder.memory_bytes:
        raise ConfigError(
            f"sizes: {size!r} does not fit on {devices} {ladder.device_type} with one sequence "
            f"per micro-batch ({memory.total / 2**30:.1f} GiB estimated, "
            f"{ladder.memory_bytes / 2**30:.1f} GiB usable); raise max_devices or turn on "
            "activation checkpointing"
        )
    batch = rank_seqs * dp_size * seq
    drift = abs(batch - target) / target
    warning = ""
    if drift > BATCH_DRIFT:
        warning = (
            f"{size}: global batch {batch:,} tokens differs from the target {target:,} by "
            f"{100 * drift:.0f}%"
        )
        warnings.warn(warning, stacklevel=3)
    return _MeshPlan(devices, rank_seqs, micro_seqs, sync_every, memory, batch, warning)


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
