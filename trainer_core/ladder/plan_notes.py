"""What a ladder's plan says beside its numbers: the tables a dry run (and a launch) prints, and
the notes and warnings under them, worded once for the ladder and the LR sweep."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainer_core.ladder.config import LadderConfig, device_counts
from trainer_core.ladder.plan import SizePlan, sweep_notes
from trainer_core.ladder.sweep import SweepRun
from trainer_core.model.counts import count_params
from trainer_core.train.schedule import MIN_DECAY_UPDATES, short_decays

LADDER_LONGER = "raise duration.chinchilla_multiple or drop early decay_points"
"""How a ladder lengthens its short decays."""
SWEEP_LONGER = "raise sweep.duration_multiple or sweep.horizons, or drop early decay_points"
"""How an LR sweep lengthens its short decays (its runs' durations are the sweep's own)."""


PLAN_TABLES = {
    "model and tokens": ("N", "layers/d/heads/kv/mlp", "tokens", "x Chinchilla"),
    "batch and optimizer": (
        "target batch",
        "batch tokens",
        "batch seqs",
        "peak lr",
        "beta2",
        "lr 95%",
        "lr at D",
        "B* law",
        "B* 95%",
    ),
    "schedule": ("steps", "warmup steps", "ckpt steps"),
    "devices and memory": (
        "devices",
        "mesh r/s/tp",
        "dp",
        "micro seqs",
        "accum",
        "grad reduce",
        "mem GiB",
        "headroom",
    ),
    "cost": ("FLOPs", "device-h", "wall h"),
}
"""The dry run's tables (title -> the columns of :meth:`SizePlan.table_row` after the size), each
narrow enough for a terminal; a sweep law's columns appear only where it sets them."""
TOTALLED = ("FLOPs", "device-h")
"""The columns summed over the sizes on the cost table's last line."""


def print_plan(job: LadderConfig, plans: list[SizePlan]) -> None:
    """The plan's tables, one row per size (never wrapped), then :func:`plan_notes`."""
    rows = [p.table_row(job) for p in plans]
    print(
        f"ladder {job.name}: {job.max_devices} x {job.device_type}, seq {job.seq_len}, "
        f"model vocab_size {job.vocab_size:,}"
    )
    console = Console(width=1000)
    for title, keys in PLAN_TABLES.items():
        columns = ["size", *(k for k in keys if k in rows[0])]
        table = Table(title=title, title_justify="left")
        for key in columns:
            justify = "left" if key in ("size", "ckpt steps") else "right"
            table.add_column(key, justify=justify, no_wrap=True)
        for row in rows:
            table.add_row(*(_fmt(row[k]) for k in columns))
        if set(TOTALLED) & set(columns):
            table.add_section()
            table.add_row(*_totals(columns, rows))
        console.print(table)
    for line in plan_notes(job, plans):
        print(line)


def _totals(columns: list[str], rows: list[dict[str, object]]) -> list[str]:
    """The line under the sizes: each :data:`TOTALLED` column's sum over them."""
    sums = {"size": "total", **{k: _fmt(sum(row[k] for row in rows)) for k in TOTALLED}}
    return [sums.get(k, "") for k in columns]


def plan_notes(job: LadderConfig, plans: list[SizePlan]) -> list[str]:
    """The lines under the tables: what the cost and memory columns assume, devices left
    unused, what sweep laws set, and per size what the formulas had to bend (batch, gradient
    reduction, decays too short, a capped warmup) and a point that measures the vocabulary."""
    lines = _assumptions(job) + _device_note(job) + sweep_notes(plans)
    for p in plans:
        lines += vocabulary_warning(p.size, p)
        if p.batch_warning:
            lines.append(f"warning: {p.batch_warning}")
        if p.config.train_module.reduce_grads_every_micro_batch:
            lines.append(
                f"note: {p.size}: FSDP's unsharded gradients would not fit during accumulation; "
                "gradients are reduced after every micro-batch instead (more traffic)"
            )
        lines += short_decay_warning(p.size, p, LADDER_LONGER)
        if p.warmup_steps < p.uncapped_warmup:
            lines.append(
                f"note: {p.size}: warmup capped at a tenth of the run, {p.warmup_steps} steps "
                f"(the formula's N tokens would be {p.uncapped_warmup})"
            )
    return lines


HEAD_SHARE = 0.5
"""The share of N in the LM head above which a size's point measures the vocabulary."""


def vocabulary_warning(name: str, plan: SizePlan) -> list[str]:
    """The warning for a run (``name``) whose N is mostly the LM head (vocab_size x d_model; the
    input embedding is not in N): its loss moves with the head, so its point on the law in N
    says little about the blocks the larger sizes are made of."""
    counts = count_params(plan.model)
    share = counts["head"] / plan.num_params
    if share <= HEAD_SHARE:
        return []
    m = plan.model
    return [
        f"warning: {name}: the LM head (vocab_size {m.vocab_size:,} x d_model {m.d_model}) is "
        f"{100 * share:.1f}% of its N ({counts['head']:,} of {plan.num_params:,}): its point "
        "measures the head, not the blocks, and bends a law fitted in N (drop the size, or "
        "use a smaller vocab_size)"
    ]


def short_decay_warning(name: str, plan: SizePlan, longer: str) -> list[str]:
    """The warning for a run (``name``) whose decays are too short to anneal, if it has any:
    their evals are not fitted, so the user should know before the run, not in the fit.
    ``longer``: how this kind of experiment lengthens them."""
    short = short_decays(plan.steps, plan.schedule)
    if not short:
        return []
    return [
        f"warning: {name}: the decays ending at steps {', '.join(map(str, short))} have fewer "
        f"than {MIN_DECAY_UPDATES} updates, too few to anneal: their evals are not fitted "
        f"({longer})"
    ]


def sweep_short_decay_warnings(runs: list[SweepRun]) -> list[str]:
    """:func:`short_decay_warning` for an LR sweep: once per size, run length and batch, whose
    trials (``<size>-c<multiple>-b<batch>-lr*``) all decay at the same steps."""
    lines = []
    for run in runs:
        lines += short_decay_warning(f"{run.trial_stem}*", run.plan, SWEEP_LONGER)
    return lines


def _assumptions(job: LadderConfig) -> list[str]:
    """What the cost and memory columns rest on, said once."""
    peak = f"{job.device_type}'s dense bf16 peak" if job.uses_gpu else "a nominal CPU worker's"
    return [
        f"cost: device-h = FLOPs / ({job.peak_flops / 1e12:g} TFLOP/s, {peak}, x assumed_mfu "
        f"{job.assumed_mfu:g}); wall h = device-h / devices",
        f"memory: mem GiB is the estimate per device, headroom what it leaves of the usable "
        f"{job.memory_bytes / 2**30:.1f} GiB (memory_fraction {job.memory_fraction:g} x "
        f"{job.device_gib:g} GiB)",
    ]


def _device_note(job: LadderConfig) -> list[str]:
    """A ``max_devices`` no run can use whole: said, with the rule that rounds it down."""
    usable = device_counts(job)[-1]
    if usable >= job.max_devices:
        return []
    parallel = job.run.parallel
    return [
        f"note: max_devices {job.max_devices}: runs use at most {usable} (a power of two "
        f"within a node or whole nodes of {job.devices_per_node}, a multiple of dp_replicate "
        f"x tp = {parallel.dp_replicate * parallel.tp})"
    ]


def _fmt(value: object) -> str:
    """Integers whole; other numbers to 3 significant figures, with thousands separators up to a
    million and as 9.5e20 beyond (and below 1e-4)."""
    if isinstance(value, float):
        text = f"{value:.3g}"
        if "e" not in text:
            return text
        digits, exponent = text.split("e")
        if 0 < int(exponent) < 6:
            return f"{round(value, 2 - int(exponent)):,.0f}"
        return f"{digits}e{int(exponent)}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
