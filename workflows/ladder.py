"""``python workflows/ladder.py [--config FILE] [--dry-run] [--resume] [--sizes 1M,3M] [--benchmark SIZE] [overrides]``

Runs a model ladder on Ray Tune, one trial per size, then fits scaling laws to the results.
No ``--config``: the embedded CPU demo, workflows/configs/ladder-demo.yaml (five tiny models
on the Python standard library).
Submit to a cluster with ``ray job submit --working-dir . -- python workflows/ladder.py ...``.
The analysis (pandas, SciPy, matplotlib) is imported only after the runs, not for a dry run.
"""

from __future__ import annotations

import sys

from trainer_core.config.cli import DEMO_LADDER, exit_on_error, parse_command
from trainer_core.config.loader import ConfigError
from trainer_core.io.output_dir import check_output_dir
from trainer_core.ladder.lr_feedback import sweep_rules
from trainer_core.ladder.plan import plan_ladder
from trainer_core.ladder.plan_notes import print_plan
from trainer_core.ladder.record import (
    as_launched,
    data_line,
    data_repeats,
    dry_run_plot_path,
    plot_ladder_schedule,
    preflight,
)
from trainer_core.ladder.sweep_match import sweep_mismatches
from trainer_core.ray.ladder_run import (
    SIZES_HELP,
    LadderJobConfig,
    benchmark_size,
    planned_settings,
    run_ladder,
)

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
    if "--resume" in own:
        job = as_launched(job, job.exp_dir)
    problems, data = preflight(job, dry_run=dry_run)
    plans = plan_ladder(job, sizes, sweep_rules(job))
    print(data_line(data, job.run.data))
    print_plan(job, plans)
    repeats = data_repeats(data, [(p.size, p.config) for p in plans])
    for problem in problems + sweep_mismatches(job) + repeats:
        print(f"warning: {problem}")
    if dry_run:
        print(f"LR schedule plot: {plot_ladder_schedule(job, plans, dry_run_plot_path(job))}")
        return 0

    from trainer_core.analysis import report_experiment

    run_ladder(job, plans, resume="--resume" in own)
    report_experiment(job.exp_dir)
    return 0


if __name__ == "__main__":
    exit_on_error(main)
