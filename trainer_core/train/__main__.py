"""``python -m trainer_core.train [--config FILE] [--section.field=value ...]``

One training run with plain PyTorch: a single process, or one process per device under
``torchrun``. With no ``--config`` it trains the built-in tiny demo (1M params on the Python
standard library, byte-level tokens, CPU-friendly).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator

from torch.distributed.checkpoint.api import CheckpointException

from trainer_core.config.cli import INTERRUPTED, exit_on_error, parse_command
from trainer_core.config.sections import TrainConfig
from trainer_core.io.output_dir import check_output_dir
from trainer_core.parallel.process_group import exit_rank, teardown
from trainer_core.train.build import build_trainer
from trainer_core.train.trainer import Trainer

PEER_GRACE_S = 2.0
"""How long a rank whose collective failed waits for torchrun's SIGINT: the peer that left it
may have been interrupted a moment before this rank was (torchrun signals ranks one by one)."""


def main(argv: list[str] | None = None) -> int:
    parsed = parse_command(__doc__, TrainConfig, sys.argv[1:] if argv is None else argv)
    if parsed is None:
        return 0
    cfg = parsed[1]
    check_output_dir(cfg.trainer.run_dir, "trainer.run_dir")
    try:
        with sigint_seen() as interrupted:
            return fit(build_trainer(cfg), interrupted)
    finally:
        teardown()


def fit(trainer: Trainer, interrupted: Callable[[float], bool] = lambda wait: False) -> int:
    """Train; a Ctrl+C ends a resumable run, not a crashed one: rank 0 records it in run.json
    and says, in one line, where it stopped and how to go on; every rank returns 130.

    Under torchrun each rank gets its own SIGINT, and none waits for the others: a rank in a
    collective when a peer, interrupted first, left it gets that collective's error rather than
    a KeyboardInterrupt (Python raises it only between bytecodes), so an error after a SIGINT
    (``interrupted``: seen within the given seconds) counts as the interrupt."""
    try:
        trainer.fit()
    except KeyboardInterrupt:
        pass  # fit recorded it
    except (Exception, CheckpointException):  # a BaseException, DCP's
        try:
            cut_short = trainer.world_size > 1 and interrupted(PEER_GRACE_S)
        except KeyboardInterrupt:  # the pending SIGINT, raised at last
            cut_short = True
        if not cut_short:
            raise
        trainer.record_interrupt()
    else:
        return 0
    if trainer.rank == 0:
        print(trainer.interruption(), file=sys.stderr)
    return INTERRUPTED


@contextlib.contextmanager
def sigint_seen() -> Iterator[Callable[[float], bool]]:
    """``interrupted(wait)``: whether this process got SIGINT, waiting up to ``wait`` seconds for
    one. Known from the signal's wakeup fd, which the interpreter writes on arrival, even where
    its KeyboardInterrupt never came (see :func:`fit`)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    seen = bytearray()

    def interrupted(wait: float) -> bool:
        deadline = time.monotonic() + wait
        while signal.SIGINT not in seen:
            if not select.select([read], [], [], max(deadline - time.monotonic(), 0))[0]:
                break
            seen.extend(os.read(read, 512))
        return signal.SIGINT in seen

    try:
        yield interrupted
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)


if __name__ == "__main__":
    # Under torchrun each rank ends without finalizing (see exit_rank), so a finished run's
    # ranks all exit 0.
    exit_on_error(main, exit_rank if int(os.environ.get("WORLD_SIZE", "1")) > 1 else sys.exit)
