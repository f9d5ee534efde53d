"""What a ladder's plan says beside its numbers: the table a dry run (and a launch) prints, and
the notes and warnings under it, worded once for the ladder and the LR sweep."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainer_core.ladder.config import LadderConfig, device_counts
from trainer_core.ladder.plan import SizePlan, sweep_notes
from trainer_core.ladder.sweep import SweepRun
from trainer_core.train.schedule import MIN_DECAY_UPDATES, short_decays

LADDER_LONGER = "raise duration.chinchilla_multiple or drop early decay_points"
"""How a ladder lengthens its short decays."""
SWEEP_LONGER = "raise sweep.duration_multiple or sweep.horizons, or drop early decay_points"
"""How an LR sweep lengthens its short decays (its runs' durations are the sweep's own)."""


def print_plan(job: LadderConfig, plans: list[SizePlan]) -> None:
    """The plan table, one row per size however wide (never wrapped), then :func:`plan_notes`."""
    table = Table(
        title=f"ladder {job.name}: {job.max_devices} x {job.device_type}, seq {job.seq_len}"
    )
    rows = [p.table_row(job) for p in plans]
    for key in rows[0]:
        table.add_column(
            key, justify="left" if key in ("size", "ckpt steps") else "right", no_wrap=True
        )
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    Console(width=1000).print(table)
    for line in plan_notes(job, plans):
        print(line)


def plan_notes(job: LadderConfig, plans: list[SizePlan]) -> list[str]:
    """The lines under the table: devices left unused, what sweep laws set, and per size what
    the formulas had to bend (batch, gradient reduction, decays too short, a capped warmup)."""
    lines = _device_note(job) + sweep_notes(plans)
    for p in plans:
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
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
