"""Learning-rate schedules with Levanter's semantics: (re)warmup -> stable -> decay, in cycles.

Each cycle is ``[warmup or rewarmup] -> [stable at peak] -> [decay to min_lr_ratio * peak]``.
``warmup`` / ``decay`` / ``rewarmup`` below 1 are fractions of the cycle (to the nearest step,
halves up), else step counts. With ``rewarmup`` 0 the LR jumps straight back to peak after a
decay: that is WSD-S, one run that yields an annealed model at the end of every cycle.

Step convention: ``lr_multiplier(s)`` is the factor for optimizer update ``s`` (0-based) and equals
the schedule evaluated after ``s + 1`` updates. So warmup gives ``(s + 1) / warmup`` (the very
first update already moves), the last warmup step reaches peak, a decay of D updates takes them at
progress 1/(D+1) .. D/(D+1), so the LR reaches ``min_lr_ratio`` just after the cycle's last update
(none is spent at LR 0), and ``decay_windows`` starts are the number of updates done before the
first decayed one (a checkpoint there is the un-annealed model).
matplotlib (~1 s to import) is loaded by :func:`schedule_figure` alone, not by training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

import torch

from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import ScheduleConfig
from trainer_core.io import storage
from trainer_core.io.storage import Location

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WSD_DEFAULT_DECAY = 0.2
"""``kind: wsd`` with ``decay: null`` decays over the last 20% of each cycle."""

INV_MIN_FLOOR = 0.1
"""inv / inv_sqrt take their steepness k from ``max(min_lr_ratio, INV_MIN_FLOOR)``: a zero floor
has no finite k, and a tiny one would make the LR collapse within the first decay steps (0.1 is
Levanter's default ``min_lr_ratio``)."""


def _steps(length: float, cycle: int) -> int:
    """A fraction (< 1) of ``cycle`` rounded to the nearest step (halves up), else a step count."""
    return int(length * cycle + 0.5) if length < 1 else int(length)


def cycle_boundaries(total_steps: int, cfg: ScheduleConfig) -> list[int]:
    """The step at which each cycle ends, increasing; the last is always ``total_steps``.

    ``cycles: c`` gives c cycles of ``total_steps // c`` steps, ``cycle_length: n`` (or a fraction
    of the run) gives ``total_steps // n`` such cycles; either way the last cycle absorbs the
    remainder. A list of ``cycles`` are the cycle ends; a list of ``cycle_length`` are the lengths,
    the last one stretched to the end of the run.
    """
    if total_steps < 1:
        raise ConfigError(f"total_steps: {total_steps} must be >= 1")
    count, length = cfg.cycles, cfg.cycle_length
    if isinstance(count, list):
        if not count or count != sorted(set(count)) or count[0] < 1 or count[-1] > total_steps:
            raise ConfigError(
                f"schedule.cycles: {count} must be a non-empty list of strictly increasing "
                f"steps in (0, {total_steps}] (the cycle ends; the run's last step is added)"
            )
        return [*count] if count[-1] == total_steps else [*count, total_steps]
    if isinstance(length, list):
        if not length or min(length) < 1 or sum(length) > total_steps:
            raise ConfigError(
                f"schedule.cycle_length: {length} must be a non-empty list of lengths >= 1 "
                f"summing to at most the run's {total_steps} steps"
            )
        return [*accumulate(length[:-1]), total_steps]
    if length is not None:
        size = _steps(length, total_steps)
        if not 1 <= size <= total_steps:
            raise ConfigError(
                f"schedule.cycle_length: {length!r} gives cycles of {size} steps; use 1 to "
                f"{total_steps} steps (or a fraction < 1 of the run)"
            )
        count = total_steps // size
    else:
        count = 1 if count is None else count
        if not 1 <= count <= total_steps:
            raise ConfigError(
                f"schedule.cycles: {count} cycles do not fit in {total_steps} steps; use 1 to "
                f"{total_steps}"
            )
        size = total_steps // count
    return [size * (i + 1) for i in range(count - 1)] + [total_steps]


@dataclass(frozen=True)
class _Cycle:
    start: int
    end: int
    warmup: int
    decay: int
    rewarm_from: float
    """The multiplier the (re)warmup rises from: 0 for the first cycle, else the previous end."""

    @property
    def decay_start(self) -> int:
        return self.end - self.decay


def _plan(total_steps: int, cfg: ScheduleConfig) -> list[_Cycle]:
    """Resolve every cycle's phase lengths in steps, validating that they fit."""
    cycles, start, rewarm_from = [], 0, 0.0
    for i, end in enumerate(cycle_boundaries(total_steps, cfg)):
        length = end - start
        name = "warmup" if i == 0 else "rewarmup"
        warm = _steps(cfg.warmup if i == 0 else cfg.rewarmup, length)
        if cfg.kind == "constant":
            decay = 0
        elif cfg.decay is not None:
            decay = _steps(cfg.decay, length)
        elif cfg.kind == "wsd":
            decay = _steps(WSD_DEFAULT_DECAY, length)
        else:
            decay = max(length - warm, 0)
        if warm + decay > length:
            raise ConfigError(
                f"schedule.{name}: {warm} {name} steps + {decay} decay steps exceed cycle {i + 1} "
                f"of {length} steps (steps {start}..{end}); shorten schedule.{name} or "
                f"schedule.decay, or use fewer cycles"
            )
        cycles.append(_Cycle(start, end, warm, decay, rewarm_from))
        rewarm_from = cfg.min_lr_ratio if decay else 1.0
        start = end
    return cycles


def _decay_shape(kind: str, t: float, floor: float) -> float:
    """Multiplier at progress ``t`` in [0, 1] through a decay from 1 down to ``floor``.

    inv / inv_sqrt are ``h(t) = (1 + k t) ** -p`` (p = 1 / 0.5) with ``k = f ** (-1 / p) - 1``,
    ``f = max(floor, INV_MIN_FLOOR)``, so ``h(1) = f``; h is then mapped linearly from
    ``[h(1), 1]`` onto ``[floor, 1]``. For ``floor >= INV_MIN_FLOOR`` that map is the identity
    (the pure curve); below it the same curve is lowered to end exactly at ``floor`` (0 included).
    """
    if kind == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
    if kind in ("inv", "inv_sqrt"):
        if floor >= 1:
            return 1.0
        power = 0.5 if kind == "inv_sqrt" else 1.0
        k = max(floor, INV_MIN_FLOOR) ** (-1 / power) - 1
        end = (1 + k) ** -power
        return floor + (1 - floor) * ((1 + k * t) ** -power - end) / (1 - end)
    return 1 - (1 - floor) * t  # linear, wsd


def _value(step: int, plan: list[_Cycle], cfg: ScheduleConfig) -> float:
    done = min(max(step, 0), plan[-1].end - 1) + 1  # updates done once this one is applied
    c = next(c for c in plan if done <= c.end)
    into = done - c.start
    if into <= c.warmup:
        return c.rewarm_from + (1 - c.rewarm_from) * into / c.warmup
    if done <= c.decay_start:
        return 1.0
    # The decay would reach its floor one update after the cycle's last: every decayed update
    # moves the weights (an update at LR 0 is a wasted step), the last at the lowest LR > floor.
    return _decay_shape(cfg.kind, (done - c.decay_start) / (c.decay + 1), cfg.min_lr_ratio)


def lr_multiplier(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """Factor on the peak LR for optimizer update ``step`` (0-based; clamped to the run)."""
    return _value(step, _plan(total_steps, cfg), cfg)


def decay_windows(total_steps: int, cfg: ScheduleConfig) -> list[tuple[int, int]]:
    """(decay start, cycle end) per cycle, in updates done: where a ladder brackets each decay
    with checkpoints. A cycle without decay gives ``(end, end)``."""
    return [(c.decay_start, c.end) for c in _plan(total_steps, cfg)]


MIN_DECAY_UPDATES = 3
"""Fewer decay updates do not anneal: a linear decay of D updates takes its last at 1 / (D + 1)
of the peak, half of it for one update (a short run's 20% of a short period)."""


def annealed_steps(total_steps: int, cfg: ScheduleConfig) -> frozenset[int]:
    """The steps that end a decay of at least :data:`MIN_DECAY_UPDATES` updates: a model there
    has finished a schedule (the points a scaling law is fitted to). A mid-decay step is not
    one, however low its LR: a cosine run's checkpoint at 3/4 of the way is above the curve a
    run of that length would reach."""
    windows = decay_windows(total_steps, cfg)
    return frozenset(end for start, end in windows if end - start >= MIN_DECAY_UPDATES)


def short_decays(total_steps: int, cfg: ScheduleConfig) -> list[int]:
    """The steps that end a decay too short to anneal (their evals are not fitted)."""
    windows = decay_windows(total_steps, cfg)
    return [end for start, end in windows if 0 < end - start < MIN_DECAY_UPDATES]


def wsds_schedule(
    decay_end_steps: list[int],
    decay_fraction: float = 0.1,
    *,
    warmup_steps: int,
    min_lr_ratio: float,
) -> ScheduleConfig:
    """WSD-S: linear decays over the last ``decay_fraction`` of each period, ending exactly at
    ``decay_end_steps``, with the LR jumping back to peak after each. Train for
    ``decay_end_steps[-1]`` steps (a longer run would stretch the last period)."""
    ends = list(decay_end_steps)
    if not ends or ends != sorted(set(ends)) or ends[0] < 1:
        raise ConfigError(
            f"decay_end_steps: {ends} must be a non-empty list of strictly increasing steps >= 1"
        )
    if not 0 < decay_fraction < 1:
        raise ConfigError(f"decay_fraction: {decay_fraction} must be in (0, 1)")
    if warmup_steps < 0:
        raise ConfigError(f"warmup_steps: {warmup_steps} must be >= 0")
    return ScheduleConfig(
        kind="wsd",
        warmup=float(warmup_steps),
        decay=decay_fraction,
        min_lr_ratio=min_lr_ratio,
        rewarmup=0.0,
        cycles=ends[:-1] or None,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR applying ``lr_multiplier`` to each group's LR; call ``step()`` after every
    optimizer step. The schedule is validated here, not at step N. A closure (not a callable
    object) keeps the state_dict to counters, so it checkpoints and reloads into a fresh one."""
    plan = _plan(total_steps, cfg)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _value(step, plan, cfg))


def plot_schedule(
    cfg: ScheduleConfig,
    total_steps: int,
    peak_lr: float,
    path: Location,
    title: str | None = None,
) -> Location:
    """Write :func:`schedule_figure` to a PNG (a local path or a URL)."""
    fig = schedule_figure(cfg, total_steps, peak_lr, title)
    fig.tight_layout()
    path = storage.normalize(path)
    storage.makedirs(storage.parent(path))
    with storage.open_file(path, "wb") as f:
        fig.savefig(f, format="png")
    return path


def schedule_figure(
    cfg: ScheduleConfig, total_steps: int, peak_lr: float, title: str | None = None
) -> Figure:
    """LR vs step, dotted lines at cycle ends, decay phases shaded; built apart from the saving
    so tests can read the drawn curve."""
    from matplotlib.figure import Figure  # no pyplot: no backend/display state, nothing to close

    plan = _plan(total_steps, cfg)
    steps = range(total_steps)
    fig = Figure(figsize=(8, 3.5), dpi=120)
    ax = fig.add_subplot()
    ax.plot(steps, [peak_lr * _value(s, plan, cfg) for s in steps], lw=1.5, label="LR")
    for c in plan:
        if c.decay:  # matplotlib leaves "_"-prefixed labels out of the legend: name one span only
            label = "_decay" if ax.patches else "decay"
            ax.axvspan(c.decay_start, c.end, color="tab:orange", alpha=0.12, label=label)
        if c.end < total_steps:
            ax.axvline(c.end, color="grey", ls=":", lw=1)
    ax.legend(loc="lower left")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(title or f"{cfg.kind} schedule, peak LR {peak_lr:.2e}, {len(plan)} cycle(s)")
    ax.grid(alpha=0.3)
    return fig
