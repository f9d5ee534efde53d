"""A callback that ends a run like a kill at a chosen step (its record out, nothing after)."""

from __future__ import annotations

from trainer_core.train.callbacks import BaseCallback


class StopAfter(BaseCallback):
    """Raises KeyboardInterrupt at the end of ``step``: that step's metrics went out, and so did
    its checkpoint if it had one; the loop's final flush still runs, as on a Ctrl+C."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, step: int) -> None:
        if step == self.step:
            raise KeyboardInterrupt
