"""``python workflows/train.py [--config FILE] [--section.field=value ...]``

One training run on Ray Train: on the cluster this job was submitted to (``ray job submit``), on
``--ray.address``, or on a local Ray started on the fly. No ``--config``: the tiny demo run.
Ray and torch are imported once the config has loaded: ``--help`` and a config error are instant.
"""

from __future__ import annotations

import sys

from trainer_core.config.cli import INTERRUPTED, exit_on_error, parse_command
from trainer_core.io.output_dir import check_output_dir
from trainer_core.io.sigterm import sigterm_as_ctrl_c
from trainer_core.ray.run_config import RayTrainConfig


def main() -> int:
    parsed = parse_command(__doc__, RayTrainConfig, sys.argv[1:])
    if parsed is None:
        return 0
    cfg = parsed[1]
    check_output_dir(cfg.trainer.run_dir, "trainer.run_dir")

    from trainer_core.ray.runtime import init_ray
    from trainer_core.ray.train_driver import RunInterruptedError, run_training

    init_ray(cfg.ray.address)
    try:
        # After ray.init, which sets a SIGTERM handler of its own: `ray job stop` as a Ctrl+C.
        with sigterm_as_ctrl_c():
            summary = run_training(cfg)
    except RunInterruptedError as e:
        print(e, file=sys.stderr)
        return INTERRUPTED
    print(
        f"run {summary.get('name')} {summary.get('status')}: step {summary.get('last_step')}, "
        f"train loss {summary.get('train/loss', float('nan')):.4f}, "
        f"eval loss {summary.get('eval/loss', float('nan')):.4f} -> {cfg.trainer.run_dir}"
    )
    # A diverged run is a result for a sweep, but a failure for the one run asked for here.
    return 0 if summary.get("status") == "finished" else 2


if __name__ == "__main__":
    exit_on_error(main)
