"""``python workflows/lr_sweep.py [--config FILE] [--sizes 1M,3M] [--resume] [--dry-run] [overrides]``

Sweeps the peak LR, and with ``sweep.batch_factors`` the global batch, for every ladder size on
Ray Tune (size x batch x LR trials, ASHA early stopping within a size and run length), at the
token horizons of ``sweep.horizons`` (under WSD-S one trial's decays give every horizon), then
fits the optimum per size and LR*(N) = a * N^b across sizes (LR*(N, D) and B* come from
``trainer_core.analysis.hparam_laws``). Feed the result back into a ladder with
``--lr.from_sweep=<this sweep's dir>`` (and ``--batch.from_sweep``). A ladder config is a sweep config (its
``sweep:`` section optional); the sweep writes to ``sweep.dir``, by default ``<ladder dir>-lr-sweep``.
No ``--config``: the CPU demo ladder's (workflows/configs/ladder-demo.yaml).
The analysis (pandas, SciPy, matplotlib) is imported only after the trials, not for a dry run.
"""

from __future__ import annotations

import sys

from trainer_core.config.cli import DEMO_LADDER, exit_on_error, parse_command
from trainer_core.ladder.plan_notes import sweep_short_decay_warnings
from trainer_core.ladder.record import as_launched, data_line, data_repeats, preflight
from trainer_core.ray.ladder_run import SIZES_HELP, planned_settings
from trainer_core.ray.sweep_run import (
    SweepJobConfig,
    as_sweep,
    run_sweep,
    sweep_plans,
    sweep_trials,
)
from trainer_core.train.schedule import decay_windows

FLAGS = {"--dry-run": False, "--resume": False, "--sizes": True}
FLAG_HELP = {
    "--dry-run": "plan and print every trial and its decays; train nothing",
    "--resume": "go on with the sweep in sweep.dir after an interrupt (ended trials are kept)",
    **SIZES_HELP,
}


def main() -> int:
    parsed = parse_command(
        __doc__, SweepJobConfig, sys.argv[1:], FLAGS, DEMO_LADDER, FLAG_HELP, planned_settings()
    )
    if parsed is None:
        return 0
    own, job = parsed[0], as_sweep(parsed[1])
    if "--resume" in own:
        job = as_launched(job, job.exp_dir)
    dry_run = "--dry-run" in own
    problems, data = preflight(job, dry_run=dry_run, dir_key="sweep.dir")
    sizes = own["--sizes"].split(",") if "--sizes" in own else None

    runs = sweep_plans(job, sizes)
    specs = sweep_trials(job, runs)
    print(data_line(data, job.run.data))
    print(
        f"LR sweep {job.name} into {job.dir}: {len(specs)} trials, then up to "
        f"{job.sweep.widen_rounds} rounds beyond the grid's edge where a best trial is at one"
    )
    for spec in specs:
        cfg = spec.config
        print(
            f"  {spec.name}: lr {cfg.optim.lr:.3e}, batch {cfg.trainer.global_batch_size} tokens, "
            f"{cfg.total_steps} steps, decays ending at {_decay_ends(cfg)}"
        )
    for line in sweep_short_decay_warnings(runs):
        print(line)
    for problem in problems + data_repeats(data, [(s.name, s.config) for s in specs]):
        print(f"warning: {problem}")
    if dry_run:
        return 0

    from trainer_core.analysis import report_experiment

    for run in run_sweep(job, runs, specs, resume="--resume" in own):
        print(run.concurrency_report())
    report_experiment(job.dir)
    return 0


def _decay_ends(cfg) -> str:
    """The steps whose evals are annealed points: one horizon each."""
    return ",".join(str(end) for _, end in decay_windows(cfg.total_steps, cfg.schedule))


if __name__ == "__main__":
    exit_on_error(main)
