"""``python workflows/ladder.py [--config FILE] [--dry-run] [--resume] [--sizes 1M,3M] [--benchmark SIZE] [overrides]``

Runs a model ladder on Ray Tune, one trial per size, then fits scaling laws to the results.
No ``--config``: the embedded CPU demo, workflows/configs/ladder-demo.yaml (five tiny models
on the Python standard library).
Submit to a cluster with ``ray job submit --working-dir . -- python workflows/ladder.py ...``.
The analysis (pandas, SciPy, matplotlib) is imported only after the runs, not for a dry run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trainer_core.config.cli import DEMO_LADDER, exit_on_error, parse_command
from trainer_core.config.loader import ConfigError
from trainer_core.io import storage
from trainer_core.io.output_dir import canonical_output, check_output_dir
from trainer_core.io.run_dir import LR_SCHEDULE
from trainer_core.io.storage import Location
from trainer_core.ladder.config import device_counts
from trainer_core.ladder.lr_feedback import sweep_rules
from trainer_core.ladder.plan import plan_ladder, sweep_notes
from trainer_core.ladder.record import data_line, data_repeats, plot_ladder_schedule, preflight
from trainer_core.ray.ladder_run import (
    SIZES_HELP,
    LadderJobConfig,
    benchmark_size,
    planned_settings,
    run_ladder,
)
from trainer_core.train.schedule import MIN_DECAY_UPDATES, short_decays

FLAGS = {
    "--dry-run": False,
    "--resume": False,
    "--sizes": True,
    "--benchmark": True,
}
FLAG_HELP = {
    "--dry-run": "plan and print every size, plot the LR schedule; train nothing",
    "--resume": "go on with the experiment in dir after an interrupt (finished runs are kept)",
    **SIZES_HELP,
    "--benchmark": "train this size a few steps here, print its tokens/s and MFU, and exit",
}


def print_plan(job: LadderJobConfig, plans) -> None:
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
    Console(width=1000).print(table)  # one row per size, however wide: never wrapped
    usable = device_counts(job)[-1]
    if usable < job.max_devices:
        parallel = job.run.parallel
        print(
            f"note: max_devices {job.max_devices}: runs use at most {usable} (a power of two "
            f"within a node or whole nodes of {job.devices_per_node}, a multiple of dp_replicate "
            f"x tp = {parallel.dp_replicate * parallel.tp})"
        )
    for line in sweep_notes(plans):
        print(line)
    for p in plans:
        if p.batch_warning:
            print(f"warning: {p.batch_warning}")
        if p.config.train_module.reduce_grads_every_micro_batch:
            print(
                f"note: {p.size}: FSDP's unsharded gradients would not fit during accumulation; "
                "gradients are reduced after every micro-batch instead (more traffic)"
            )
        short = short_decays(p.steps, p.schedule)
        if short:
            print(
                f"warning: {p.size}: the decays ending at steps {', '.join(map(str, short))} "
                f"have fewer than {MIN_DECAY_UPDATES} updates, too few to anneal: their evals are "
                "not fitted (raise duration.chinchilla_multiple or drop early decay_points)"
            )
        if p.warmup_steps < p.uncapped_warmup:
            print(
                f"note: {p.size}: warmup capped at a tenth of the run, {p.warmup_steps} steps "
                f"(the formula's N tokens would be {p.uncapped_warmup})"
            )


def dry_run_plot_path(job: LadderJobConfig) -> Location:
    """In the experiment dir (where a launch draws it, once its checks pass) where
    :func:`_dry_run_may_write` allows, else ``./<name>-lr_schedule.png``: a dry run plans from
    the config alone."""
    if not _dry_run_may_write(job.exp_dir):
        return Path.cwd() / f"{job.name}-lr_schedule.png"
    return storage.join(job.exp_dir, LR_SCHEDULE)


def _dry_run_may_write(exp_dir: Location) -> bool:
    """This machine can write the dir, and doing so makes no tree of missing dirs: the dir or
    its parent exists, or it is the local default. A cluster's path (/mnt/shared/...) made on a
    workstation would later shadow the real mount point; a bucket has no dirs to make."""
    try:
        check_output_dir(exp_dir, "dir")
    except ConfigError:
        return False
    if storage.is_url(exp_dir):
        return True
    return exp_dir.parent.is_dir() or str(exp_dir) == canonical_output(LadderJobConfig.dir)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def main() -> int:
    parsed = parse_command(
        __doc__, LadderJobConfig, sys.argv[1:], FLAGS, DEMO_LADDER, FLAG_HELP, planned_settings()
    )
    if parsed is None:
        return 0
    own, job = parsed
    sizes = own["--sizes"].split(",") if "--sizes" in own else None
    dry_run = "--dry-run" in own
    if "--benchmark" in own:
        if others := [f for f in ("--dry-run", "--resume", "--sizes") if f in own]:
            raise ConfigError(
                f"--benchmark times one size and trains no ladder: drop {', '.join(others)}"
            )
        check_output_dir(job.dir, "dir")
        result = benchmark_size(job, own["--benchmark"])
        print(
            f"benchmark {result['size']}: {result['tokens_per_s_per_device']:,.0f} tokens/s per device, "
            f"MFU {100 * result['mfu']:.1f}% on {result['devices']} device(s)"
        )
        return 0
    problems, data = preflight(job, dry_run=dry_run)
    rules = sweep_rules(job)
    plans = plan_ladder(job, sizes, rules)
    print(data_line(data, job.run.data))
    print_plan(job, plans)
    for problem in problems + data_repeats(data, [(p.size, p.config) for p in plans]):
        print(f"warning: {problem}")
    if dry_run:
        print(f"LR schedule plot: {plot_ladder_schedule(job, plans, dry_run_plot_path(job))}")
        return 0

    from trainer_core.analysis import report_experiment

    run_ladder(job, sizes, resume="--resume" in own, rules=rules)
    report_experiment(job.exp_dir)
    return 0


if __name__ == "__main__":
    exit_on_error(main)
