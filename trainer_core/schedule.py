"""Learning-rate schedules with Levanter's semantics: warmup -> stable -> decay, in cycles.

Each cycle is ``[(re)warmup] -> [stable at peak] -> [decay to min_lr_ratio * peak]``. Lengths
below 1 are fractions of the cycle, else steps. ``cycles`` (a count, or the steps where cycles
end) and ``cycle_length`` split the run; with rewarmup 0 the LR jumps back to peak after each
decay, which is WSD-S (warmup-stable-decay-simplified): one run, a decayed model at every cycle
end. Step ``s`` is the (s+1)-th optimizer update: warmup gives ``(s + 1) / warmup`` so the first
update already moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer_core.config import ScheduleConfig
from trainer_core.configio import ConfigError

WSD_DEFAULT_DECAY = 0.2


def _steps(length: float, cycle: int) -> int:
    return round(length * cycle) if length < 1 else int(length)


def cycle_boundaries(total_steps: int, cfg: ScheduleConfig) -> list[int]:
    """The step at which each cycle ends (the last is ``total_steps``)."""
    if cfg.cycles is None and cfg.cycle_length is None:
        return [total_steps]
    if isinstance(cfg.cycles, int):
        if cfg.cycles < 1:
            raise ConfigError(f"schedule.cycles: {cfg.cycles} must be >= 1")
        size = total_steps // cfg.cycles
        return [size * (i + 1) for i in range(cfg.cycles - 1)] + [total_steps]
    if isinstance(cfg.cycles, list):
        ends = list(cfg.cycles)
        if ends != sorted(set(ends)) or not ends or ends[0] <= 0 or ends[-1] > total_steps:
            raise ConfigError(
                f"schedule.cycles: {ends} must be increasing steps in (0, {total_steps}]"
            )
        return ends if ends[-1] == total_steps else ends + [total_steps]
    length = cfg.cycle_length
    if isinstance(length, list):
        if any(x < 1 for x in length) or sum(length) > total_steps:
            raise ConfigError(
                f"schedule.cycle_length: {length} must be positive step counts summing to at "
                f"most {total_steps}"
            )
        ends = [sum(length[: i + 1]) for i in range(len(length))]
        return ends[:-1] + [total_steps]
    size = _steps(float(length), total_steps)
    if size < 1:
        raise ConfigError(f"schedule.cycle_length: {length} gives cycles shorter than one step")
    ends = list(range(size, total_steps, size))
    return ends + [total_steps]


@dataclass(frozen=True)
class _Cycle:
    start: int
    end: int
    warmup: int
    decay: int

    @property
    def decay_start(self) -> int:
        return self.end - self.decay


def _cycles(total_steps: int, cfg: ScheduleConfig) -> list[_Cycle]:
    cycles, start = [], 0
    for i, end in enumerate(cycle_boundaries(total_steps, cfg)):
        length = end - start
        warm = _steps(cfg.warmup if i == 0 else cfg.rewarmup, length)
        if cfg.kind == "constant":
            decay = 0
        elif cfg.decay is None:
            decay = round(WSD_DEFAULT_DECAY * length) if cfg.kind == "wsd" else length - warm
        else:
            decay = _steps(cfg.decay, length)
        if warm + decay > length:
            raise ConfigError(
                f"schedule.warmup: warmup ({warm}) + decay ({decay}) steps exceed the cycle "
                f"of {length} steps ({start}..{end})"
            )
        cycles.append(_Cycle(start, end, warm, decay))
        start = end
    return cycles


def _decay_shape(kind: str, t: float, floor: float) -> float:
    """Multiplier at progress ``t`` in [0, 1] through a decay that ends at ``floor``."""
    if kind in ("linear", "wsd"):
        return 1 - (1 - floor) * t
    if kind == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
    # inv / inv_sqrt: 1/(1+k t)^p with k chosen so the curve lands on the floor at t = 1;
    # a zero floor has no such k, so the curve is mixed linearly down to it instead.
    power = 0.5 if kind == "inv_sqrt" else 1.0
    target = max(floor, 0.01)
    k = target ** (-1 / power) - 1
    value = (1 + k * t) ** -power
    return value if floor > 0 else value * (1 - t)


def lr_multiplier(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """Factor applied to the peak LR for optimizer step ``step`` (0-based)."""
    cycles = _cycles(total_steps, cfg)
    step = min(max(step, 0), total_steps - 1)
    i = next(k for k, c in enumerate(cycles) if step < c.end)
    c = cycles[i]
    floor = cfg.min_lr_ratio
    offset = step - c.start
    if offset < c.warmup:
        if i == 0:
            return (offset + 1) / c.warmup
        return floor + (1 - floor) * (offset + 1) / c.warmup
    if step < c.decay_start or c.decay == 0:
        return 1.0
    t = (step - c.decay_start + 1) / c.decay
    return _decay_shape(cfg.kind, t, floor)


def decay_windows(total_steps: int, cfg: ScheduleConfig) -> list[tuple[int, int]]:
    """(decay start, cycle end) per cycle: where a ladder puts its before/after checkpoints."""
    return [(c.decay_start, c.end) for c in _cycles(total_steps, cfg)]


def wsds_schedule(
    decay_end_steps: list[int], decay_fraction: float, warmup_steps: int, min_lr_ratio: float
) -> ScheduleConfig:
    """WSD-S whose decays (the last ``decay_fraction`` of each period) end at the given steps."""
    ends = sorted(decay_end_steps)
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
    _cycles(total_steps, cfg)  # validate now, not at step N
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, total_steps, cfg)
    )


def plot_schedule(
    cfg: ScheduleConfig,
    total_steps: int,
    peak_lr: float,
    path: str | Path,
    title: str | None = None,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(range(total_steps))
    lrs = [peak_lr * lr_multiplier(s, total_steps, cfg) for s in steps]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(steps, lrs, lw=1.5)
    for end in cycle_boundaries(total_steps, cfg)[:-1]:
        ax.axvline(end, color="grey", ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(title or f"{cfg.kind} schedule, peak {peak_lr:.2e}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
