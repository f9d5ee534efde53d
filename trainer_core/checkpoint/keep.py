"""The keep policy: when a step saves a temporary or a permanent checkpoint (Levanter's rules)."""

from __future__ import annotations

from typing import Literal

import torch.distributed as dist

from trainer_core.config.sections import CheckpointConfig
from trainer_core.parallel.process_group import is_distributed

Decision = Literal["none", "temporary", "permanent"]


class CheckpointPolicy:
    """When to save: temporary every N steps / M minutes, permanent by ``keep`` rules and steps.

    ``keep`` rules are tried in order and the first whose ``until`` is unset or >= step decides
    (Levanter's semantics), so "every 1000 until 10000, every 5000 until 40000, every 10000"
    keeps 1000..10000, 15000..40000, 50000, ... Any returned save restarts the minute clock;
    the clock starts at the first ``decide`` call.
    """

    def __init__(self, cfg: CheckpointConfig):
        self.cfg = cfg
        self._last_save: float | None = None

    def is_permanent(self, step: int) -> bool:
        if step <= 0:
            return False
        if step in self.cfg.keep_steps:
            return True
        for rule in self.cfg.keep:
            if rule.until is None or step <= rule.until:
                return step % rule.every == 0
        return False

    def decide(self, step: int, now: float, *, final: bool = False) -> Decision:
        """This rank's decision for a save after ``step`` updates (``now``: ``time.time()``)."""
        if not self.cfg.enabled:
            return "none"
        if self._last_save is None:
            self._last_save = now
        every, minutes = self.cfg.save_interval_steps, self.cfg.save_interval_minutes
        if self.is_permanent(step) or (final and self.cfg.save_final):
            kind: Decision = "permanent"
        elif (every is not None and step % every == 0) or (
            minutes is not None and now - self._last_save >= 60 * minutes
        ):
            kind = "temporary"
        else:
            return "none"
        self._last_save = now
        return kind

    def decide_all_ranks(self, step: int, now: float, *, final: bool = False) -> Decision:
        """Rank 0's decision on every rank (clocks differ and a save needs every rank).

        A collective when a process group exists and minute-based saves are on: call it on
        every rank at the same step.
        """
        decision = self.decide(step, now, final=final)
        if self.cfg.save_interval_minutes is not None and is_distributed():
            box = [decision]
            dist.broadcast_object_list(box, src=0)
            decision = box[0]
            if decision != "none":
                self._last_save = now
        return decision
