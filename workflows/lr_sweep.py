"""``python workflows/lr_sweep.py [--config FILE] [--sizes 1M,3M] [--resume] [--dry-run] [overrides]``

Sweeps the peak LR for every ladder size on Ray Tune (size x LR trials, ASHA early stopping),
then fits the optimum per size and LR*(N) = a * N^b across sizes. Feed the result back into a
ladder with ``--lr.from_sweep=<this sweep's dir>``. A ladder config is a sweep config (its
``sweep:`` section optional); the sweep writes to ``sweep.dir``, by default ``<ladder dir>-lr-sweep``.
No ``--config``: the CPU demo ladder's (workflows/configs/ladder-demo.yaml).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_core.cli import exit_on_error, load_from_args, print_help, split_args  # noqa: E402
from trainer_core.paths import check_output_dir  # noqa: E402
from trainer_core.ray.sweep_run import SweepJobConfig, as_sweep  # noqa: E402
from workflows.ladder import DEMO_CONFIG  # noqa: E402

FLAGS = {"--config": True, "--dry-run": False, "--resume": False, "--sizes": True}


def main() -> int:
    argv = sys.argv[1:]
    if "--help" in argv or "-h" in argv:
        print_help(__doc__.strip().splitlines()[0], SweepJobConfig)
        return 0
    own, overrides = split_args(argv, FLAGS)
    own.setdefault("--config", str(DEMO_CONFIG))
    job = as_sweep(load_from_args(SweepJobConfig, own, overrides))
    check_output_dir(job.dir, "sweep.dir")
    sizes = own["--sizes"].split(",") if "--sizes" in own else None

    from trainer_core.ray.sweep_run import run_sweep, sweep_plans, sweep_trials

    specs = sweep_trials(job, sweep_plans(job, sizes))
    print(
        f"LR sweep {job.name} into {job.dir}: {len(specs)} trials, then up to "
        f"{job.sweep.widen_rounds} rounds beyond the grid's edge where the best LR is at one"
    )
    for spec in specs:
        print(f"  {spec.name}: lr {spec.config.optim.lr:.3e}, {spec.config.total_steps} steps")
    if "--dry-run" in own:
        return 0

    from trainer_core.analysis import report_experiment

    for run in run_sweep(job, sizes, resume="--resume" in own):
        print(run.concurrency_report())
    report_experiment(Path(job.dir))
    return 0


if __name__ == "__main__":
    exit_on_error(main)
