"""Ending a run like a kill at a chosen step: a callback (its record out, nothing after), or a
batch feed that runs dry."""

from __future__ import annotations

import pytest

from trainer_core.train.callbacks import BaseCallback


class StopAfter(BaseCallback):
    """Raises KeyboardInterrupt at the end of ``step``: that step's metrics went out, and so did
    its checkpoint if it had one; the loop's final flush still runs, as on a Ctrl+C."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, step: int) -> None:
        if step == self.step:
            raise KeyboardInterrupt


def crash_after(trainer, steps: int) -> None:
    """Run ``trainer`` and stop it like a crash once ``steps`` batches were used."""
    batches = trainer.train_batches

    def stop(start):
        it = batches(start)
        for _ in range(steps - start):
            yield next(it)
        raise KeyboardInterrupt

    trainer.train_batches = stop
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
