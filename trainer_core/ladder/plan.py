"""Planning a ladder: from a list of sizes to one fully specified training run per size.

A plan's output is the run itself: each size's :class:`TrainConfig`, the ladder's ``run``
template with the planned fields filled in by ``dataclasses.replace``. Under WSD-S the decays
(the last 10% of each period) end at 1/8, 1/4, 1/2 and 1 of the run, with permanent checkpoints
and evals just before and after every decay, so one run gives points at several Chinchilla
multiples. Warmup is N tokens but at most a tenth of the run: at short durations the cap binds,
and the dry run shows both numbers. Sweep laws (``lr.from_sweep``, ``batch.from_sweep``, see
:mod:`~trainer_core.ladder.lr_feedback`) replace the LR and batch formulas per size and horizon.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, replace

from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import (
    SIZE_DIMS,
    ModelConfig,
    ScheduleConfig,
    TrainConfig,
)
from trainer_core.config.sizes import check_sizes
from trainer_core.devices import device_hours
from trainer_core.errors import RunWarning
from trainer_core.io import storage
from trainer_core.io.run_dir import RUNS
from trainer_core.ladder.batch import (
    BATCH_DRIFT,
    DEVICE_SEARCH_LIMIT,
    batch_and_devices,
    fewest_devices,
    min_mesh_and_micro,
    one_sequence_floor,
    rank_batch_and_micro,
    rank_token_floor,
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
from trainer_core.ladder.lr_feedback import SweepChoice, SweepRules
from trainer_core.ladder.memory import MemoryEstimate
from trainer_core.model.counts import count_params, num_flops_per_token
from trainer_core.parallel.mesh import dp_layout, mesh_shape
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
    lr_choice: SweepChoice | None = None
    """Set by ``lr.from_sweep``: the law, its interval and the horizon it was read at."""
    batch_choice: SweepChoice | None = None
    """Set by ``batch.from_sweep``: B* before the mesh rounds it, with its interval."""

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
        return device_hours(self.total_flops, ladder.peak_flops, ladder.assumed_mfu)

    def wall_hours(self, ladder: LadderConfig) -> float:
        """Hours the run takes on its devices, at the assumed MFU."""
        return self.device_hours(ladder) / self.devices

    def table_row(self, ladder: LadderConfig) -> dict[str, object]:
        m = self.model
        return {
            "size": self.size,
            "N": self.num_params,
            "layers/d/heads/kv/mlp": (
                f"{m.n_layers}/{m.d_model}/{m.n_heads}/{m.n_kv_heads}/{m.mlp_hidden}"
            ),
            "tokens": self.tokens,
            "x Chinchilla": self.chinchilla_multiple,
            "target batch": self.target_batch_tokens,
            "batch tokens": self.batch_tokens,
            "batch seqs": self.batch_seqs,
            "peak lr": self.lr,
            "beta2": self.config.optim.beta2,
            "steps": self.steps,
            "warmup steps": (
                f"{self.warmup_steps} (cap; formula {self.uncapped_warmup})"
                if self.warmup_steps < self.uncapped_warmup
                else self.warmup_steps
            ),
            "ckpt steps": ",".join(map(str, self.checkpoint_steps)),
            "devices": self.devices,
            "mesh r/s/tp": "/".join(map(str, self.mesh)),
            "dp": self.dp_size,
            "micro seqs": self.micro_batch_seqs,
            "accum": self.grad_accum,
            "grad reduce": (
                "every micro"
                if self.config.train_module.reduce_grads_every_micro_batch
                else "per step"
            ),
            "mem GiB": round(self.memory.total / 2**30, 2),
            "headroom": f"{100 * (1 - self.memory.total / ladder.memory_bytes):.0f}%",
            "FLOPs": self.total_flops,
            "device-h": self.device_hours(ladder),
            "wall h": self.wall_hours(ladder),
            **self._sweep_columns(),
        }

    def _sweep_columns(self) -> dict[str, object]:
        """The dry run's columns for what sweep laws set (none for formula plans)."""
        columns: dict[str, object] = {}
        if self.lr_choice:
            columns["lr 95%"] = self.lr_choice.interval(".3g").removeprefix("95% ")
            columns["lr at D"] = round(self.lr_choice.D)
        if self.batch_choice:
            columns["B* law"] = round(self.batch_choice.value)
            columns["B* 95%"] = self.batch_choice.interval(",.0f").removeprefix("95% ")
        return columns

    @property
    def decay_end_tokens(self) -> list[int]:
        """Tokens at the end of each decay: the horizons a WSD-S run gives annealed points at."""
        return [end * self.batch_tokens for _, end in decay_windows(self.steps, self.schedule)]

    def hparam_record(self) -> dict[str, object]:
        """plan.json's account of what sweep laws set (empty for formula plans)."""
        record: dict[str, object] = {}
        if self.lr_choice:
            ends = {"decay_end_tokens": self.decay_end_tokens}
            record["lr_sweep"] = {**self.lr_choice.as_record(), **ends}
        if self.batch_choice:
            record["batch_sweep"] = self.batch_choice.as_record()
        return record


def plan_size(size: str, ladder: LadderConfig, rules: SweepRules | None = None) -> SizePlan:
    """One size's run, fully specified: the ladder's ``run`` template with the model, batch,
    devices, micro-batch, LR, beta2, duration, schedule and permanent checkpoints filled in.

    The order matters: memory decides the smallest mesh and micro-batch, the target batch then
    picks the device count, and only the final mesh fixes the micro-batch and the batch (whole
    micro-batches per rank); duration, warmup and the schedule follow from that batch. ``rules``
    (:func:`~trainer_core.ladder.lr_feedback.sweep_rules`) replace the batch and LR formulas
    with sweep laws: B* at the configured horizon, LR* at the run's final one.
    """
    run = ladder.run
    if size in ladder.size_table:  # the dims themselves: the run's config names no table size
        dims = asdict(ladder.size_table[size])
        model = replace(run.model, size="", vocab_size=ladder.vocab_size, **dims)
    else:
        dims = dict.fromkeys(SIZE_DIMS, 0)
        model = replace(run.model, size=size, vocab_size=ladder.vocab_size, **dims)
    n = count_params(model)["non_embedding"]
    try:
        model.check_tensor_parallel(run.parallel.tp)
    except ConfigError as e:
        raise ConfigError(f"run.{e} (or drop size {size!r})") from None
    multiple = chinchilla_multiple(size, ladder.duration)
    horizon = train_tokens(n, multiple, ladder.duration)
    batch_choice = rules.batch(n, horizon) if rules else None
    target = round(batch_choice.value) if batch_choice else target_batch_tokens(n, ladder.batch)
    if target > horizon:
        raise ConfigError(
            f"{size}: a batch of {target:,} tokens is more than its whole run of {horizon:,} "
            f"tokens; lower batch.coef or batch.exponent, or raise duration.chinchilla_multiple "
            f"(multiple_by_size.{size}); in an LR sweep, lower sweep.batch_factors or raise "
            "sweep.horizons"
        )
    mesh = _mesh_and_batch(size, model, ladder, target, _batch_tolerance(batch_choice))
    batch = mesh.batch_tokens
    steps = max(1, math.ceil(horizon / batch))
    uncapped_warmup = max(1, round(ladder.duration.warmup_tokens_per_param * n / batch))
    warmup = min(uncapped_warmup, max(1, steps // 10))
    try:
        schedule, ckpt_steps = _schedule_and_checkpoints(steps, warmup, ladder.duration)
    except ConfigError as e:  # named in schedule.* keys, which a ladder sets through duration.*
        raise ConfigError(
            f"{size}: its {steps} steps of {batch:,} tokens can't hold its warmup and decays "
            f"({e}); raise duration.chinchilla_multiple (multiple_by_size.{size}), drop early "
            "duration.decay_points or lower duration.warmup_tokens_per_param; in an LR sweep, "
            "raise sweep.horizons or lower sweep.batch_factors"
        ) from None
    lr_choice = rules.lr(n, steps * batch) if rules else None
    lr, source = (
        (lr_choice.value, f"sweep {ladder.lr.from_sweep}")
        if lr_choice
        else (peak_lr(n, ladder.lr), "formula")
    )
    tags = [f"lr_source={source}"]
    if batch_choice:
        tags.append(f"batch_source=sweep {ladder.batch.from_sweep}")
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
            tags=[*run.tracking.tags, *tags],
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
        lr_choice=lr_choice,
        batch_choice=batch_choice,
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


def _batch_tolerance(choice: SweepChoice | None) -> float:
    """How far the mesh may move the batch from its target to give whole, larger micro-batches:
    BATCH_DRIFT for the formula; for a sweep's B*, no further than the law's interval (beyond it
    the sweep says the loss is worse)."""
    if choice is None or not math.isfinite(choice.low):
        return BATCH_DRIFT
    return min(BATCH_DRIFT, choice.high / choice.value - 1, 1 - choice.low / choice.value)


def _mesh_and_batch(
    size: str, model: ModelConfig, ladder: LadderConfig, target: int, max_drift: float
) -> _MeshPlan:
    """Devices, per-rank batch and micro-batch for one size (see :mod:`trainer_core.ladder.batch`),
    within ``max_drift`` of the target where the mesh allows, or a ConfigError when the model
    does not fit ``max_devices``."""
    seq = ladder.seq_len
    min_devices, micro_seqs = min_mesh_and_micro(model, ladder)
    if min_devices > ladder.max_devices:
        raise _too_few_devices(size, model, ladder)
    target_seqs = max(1, round(target / seq))
    counts = rank_token_floor(device_counts(ladder), min_devices, target_seqs * seq, ladder)
    batch_seqs, devices = batch_and_devices(
        target_seqs, micro_seqs, min_devices, counts, ladder.run.parallel, max_drift
    )
    dp_size = dp_layout(ladder.run.parallel, devices).dp_size
    rank_seqs, micro_seqs, sync_every, memory = rank_batch_and_micro(
        model, ladder, devices, dp_size, target_seqs, batch_seqs // dp_size, max_drift
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
        warnings.warn(warning, RunWarning, stacklevel=3)
    return _MeshPlan(devices, rank_seqs, micro_seqs, sync_every, memory, batch, warning)


def _too_few_devices(size: str, model: ModelConfig, ladder: LadderConfig) -> ConfigError:
    """The error for a size ``max_devices`` can't hold: how many devices it needs, or, where the
    part of a step no mesh shrinks is over the budget alone, that part and what shrinks it."""
    parallel = ladder.run.parallel
    checkpointing = (
        ["set run.parallel.activation_checkpointing: full"]
        if parallel.activation_checkpointing != "full"
        else []
    )
    floor = one_sequence_floor(model, ladder)
    usable = ladder.memory_bytes
    if floor.total > usable:
        fused = [] if parallel.compile else ["set run.parallel.compile: true (a fused loss)"]
        changes = ["shorten seq_len", *fused, *checkpointing, "use a smaller vocab_size"]
        return ConfigError(
            f"sizes: {size!r} fits no number of {ladder.device_type}: one sequence of "
            f"{ladder.seq_len:,} tokens takes {_gib(floor.total)} on every device however many "
            f"share the model (activations {_gib(floor.activations)}, logits "
            f"{_gib(floor.logits)}, gathered parameters {_gib(floor.gathered_params)}), over the "
            f"{_gib(usable)} usable (memory_fraction x device memory); {', '.join(changes)}, "
            "or drop this size"
        )
    need = fewest_devices(model, ladder)
    needs, raise_to = (
        (f"{need:,}", f"raise max_devices to {need}")
        if need
        else (f"more than {DEVICE_SEARCH_LIMIT:,}", "raise max_devices")
    )
    return ConfigError(
        f"sizes: {size!r} needs {needs} devices of {ladder.device_type} (memory estimate, one "
        f"sequence per micro-batch), more than max_devices={ladder.max_devices}; "
        f"{', '.join([raise_to, *checkpointing])}, or drop this size"
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


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


def plan_ladder(
    ladder: LadderConfig, sizes: list[str] | None = None, rules: SweepRules | None = None
) -> list[SizePlan]:
    """Plans for the given sizes; batch-drift warnings are kept on each plan (``batch_warning``)."""
    check_sizes(sizes or [], "sizes", ladder.size_table)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [plan_size(s, ladder, rules) for s in sizes or ladder.sizes]


def sweep_notes(plans: list[SizePlan]) -> list[str]:
    """The dry run's account of what sweep laws set: per size the value, the law's interval and
    the horizon that set it; under WSD-S, what the earliest decay's horizon would want."""
    lines = []
    lr_plans = [p for p in plans if p.lr_choice]
    if lr_plans:
        c = lr_plans[0].lr_choice
        where = (
            "; each size's peak LR is read at its run's final D (the last decay: the horizon "
            "the run is budgeted for)"
            if c.d_exponent
            else ""
        )
        lines.append(f"lr.from_sweep {c.sweep_dir}: {c.law}{where}")
        lines += [f"  {_lr_note(p)}" for p in lr_plans]
    batch_plans = [p for p in plans if p.batch_choice]
    if batch_plans:
        c = batch_plans[0].batch_choice
        lines.append(
            f"batch.from_sweep {c.sweep_dir}: {c.law}; each size's B* at its configured "
            "horizon, rounded by the mesh (whole micro-batches per data-parallel rank) within "
            "the law's interval where it can"
        )
        lines += [f"  {_batch_note(p)}" for p in batch_plans]
    return lines


def _extrapolated(choice: SweepChoice) -> str:
    if not choice.extrapolated:
        return ""
    return f" [extrapolated: {' and '.join(choice.extrapolated)} outside the swept cells]"


def _lr_note(p: SizePlan) -> str:
    c = p.lr_choice
    line = f"{p.size}: peak lr {c.value:.3g} ({c.interval('.3g')}) at D = {c.D:,.0f} tokens"
    ends = p.decay_end_tokens
    if len(ends) > 1 and c.d_exponent:
        first = c.at(ends[0])
        line += (
            f"; the first decay, at {ends[0]:,} tokens, would want {first:.3g} "
            f"({first / c.value:.2f}x)"
        )
    return line + _extrapolated(c)


def _batch_note(p: SizePlan) -> str:
    c = p.batch_choice
    line = (
        f"{p.size}: batch {p.batch_tokens:,} tokens ({p.batch_seqs} seqs) for B* = "
        f"{c.value:,.0f} ({c.interval(',.0f')}) at D = {c.D:,.0f} tokens"
    )
    if not c.covers(p.batch_tokens):
        line += "; OUTSIDE the law's interval: the mesh allows no closer batch"
    return line + _extrapolated(c)


def named_run(cfg: TrainConfig, ladder: LadderConfig, run_name: str) -> TrainConfig:
    """``cfg`` as the ladder's run ``run_name``: its dir under ``<dir>/runs``, its W&B name."""
    return replace(
        cfg,
        trainer=replace(
            cfg.trainer,
            run_dir=str(storage.join(ladder.exp_dir, RUNS, run_name)),
        ),
        tracking=replace(cfg.tracking, name=f"{ladder.name}-{run_name}"),
    )
