"""The keep policy: when a step saves a temporary or a permanent checkpoint (Levanter's rules)."""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.distributed as dist

from trainer_core.config.sections import CheckpointConfig
from trainer_core.parallel.process_group import collective_device, is_distributed

Decision = Literal["none", "temporary", "permanent"]
DECISIONS: tuple[Decision, ...] = get_args(Decision)


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

    def decide(self, step: int, now: float, *, final: bool = False, clock: bool = True) -> Decision:
        """This rank's decision for a save after ``step`` updates (``now``: ``time.time()``);
        ``clock=False`` leaves the minute clock out (the decision is then the step's alone)."""
        if not self.cfg.enabled:
            return "none"
        if self._last_save is None:
            self._last_save = now
        every, minutes = self.cfg.save_interval_steps, self.cfg.save_interval_minutes
        if self.is_permanent(step) or (final and self.cfg.save_final):
            kind: Decision = "permanent"
        elif (every is not None and step % every == 0) or (
            clock and minutes is not None and now - self._last_save >= 60 * minutes
        ):
            kind = "temporary"
        else:
            return "none"
        self._last_save = now
        return kind

    def decide_all_ranks(
        self,
        step: int,
        now: float,
        *,
        final: bool = False,
        clock: bool = True,
        device: torch.device | None = None,
    ) -> Decision:
        """Rank 0's decision on every rank (clocks differ and a save needs every rank).

        Step-based decisions agree on every rank without talking. The minute clock is read only
        where ``clock`` (the trainer passes its log steps, which sync anyway), and then rank 0's
        decision goes out as a one-element tensor on ``device`` (as the group needs it): call it
        with the same ``clock`` on every rank at the same step.
        """
        decision = self.decide(step, now, final=final, clock=clock)
        if clock and self.cfg.save_interval_minutes is not None and is_distributed():
            where = collective_device(None, device or torch.device("cpu"))
            box = torch.tensor([DECISIONS.index(decision)], device=where)
            dist.broadcast(box, src=0)
            decision = DECISIONS[int(box.item())]
            if decision != "none":
                self._last_save = now
        return decision
