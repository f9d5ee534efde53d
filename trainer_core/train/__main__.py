"""``python -m trainer_core.train [--config FILE] [--section.field=value ...]``

One training run with plain PyTorch: a single process, or one process per device under
``torchrun``. With no ``--config`` it trains the built-in tiny demo (1M params on the Python
standard library, byte-level tokens, CPU-friendly).
"""

from __future__ import annotations

import os
import sys

from trainer_core.config.cli import exit_on_error, parse_command
from trainer_core.config.sections import TrainConfig
from trainer_core.io.output_dir import check_output_dir
from trainer_core.parallel.process_group import exit_rank, teardown
from trainer_core.train.build import build_trainer


def main(argv: list[str] | None = None) -> int:
    parsed = parse_command(__doc__, TrainConfig, sys.argv[1:] if argv is None else argv)
    if parsed is None:
        return 0
    cfg = parsed[1]
    check_output_dir(cfg.trainer.run_dir, "trainer.run_dir")
    try:
        build_trainer(cfg).fit()
    finally:
        teardown()
    return 0


if __name__ == "__main__":
    # Under torchrun each rank ends without finalizing (see exit_rank), so a finished run's
    # ranks all exit 0.
    exit_on_error(main, exit_rank if int(os.environ.get("WORLD_SIZE", "1")) > 1 else sys.exit)
