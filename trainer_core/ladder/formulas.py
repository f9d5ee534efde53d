"""The ladder's formulas: target batch, peak LR, duration and beta2 as functions of N.

Defaults follow OLMo-core's model ladder (``WSDSChinchillaRunConfigurator``): N counts every
parameter except the input embedding; target batch = 2048*160*(N/108e6)^(2/3) tokens and peak
LR = 0.0047*(N/108e6)^(-1/3) (halved for WSD), both as OLMo-core's code takes them from Porian
et al. 2024 ("Resolving Discrepancies in Compute-Optimal Scaling of Language Models", which it
cites); beta2 0.95 for batches of >= 524,288 tokens else 0.99 (:class:`Beta2Formula`); duration =
20*N*c tokens. Each formula is a config section a ladder file can override, and a named function
a reader can find and test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainer_core.config.sections import (
    require,
)

BATCH_SWEEP_LAWS = {"D": ("D",), "N,D": ("N", "D")}
"""``batch.sweep_law`` -> the factors of the fitted B* law."""


def require_power_law(formula: BatchFormula | LRFormula) -> None:
    """``coef * (N / ref_params) ** exponent`` is a batch or an LR only with both positive."""
    for name in ("coef", "ref_params"):
        value = getattr(formula, name)
        require(value > 0, name, value, "must be > 0")


@dataclass
class BatchFormula:
    """Target global batch in tokens: ``coef * (N / ref_params) ** exponent``, or fitted by a
    sweep over batch sizes (``from_sweep``)."""

    coef: float = 2048 * 160
    """Target batch in tokens at N = ref_params."""
    ref_params: float = 108e6
    """The N (parameters but the input embedding) where the target is coef."""
    exponent: float = 2 / 3
    """The power of N the batch grows with (OLMo's 2/3); 0 = one batch for every size."""
    from_sweep: str = ""
    """A sweep dir that varies the batch: each size's target batch is the fitted B* at the size's
    own horizon, rounded as the mesh allows."""
    sweep_law: str = "D"
    """'D': B*(D), independent of N (Power Lines, Step Law); 'N,D': B*(N, D)."""

    def __post_init__(self) -> None:
        require_power_law(self)
        require(
            0 <= self.exponent <= 2,
            "exponent",
            self.exponent,
            "must be in [0, 2] (the batch grows with N: OLMo's 2/3, 0 for one batch for all)",
        )
        require(
            self.sweep_law in BATCH_SWEEP_LAWS,
            "sweep_law",
            self.sweep_law,
            f"use one of {', '.join(repr(k) for k in BATCH_SWEEP_LAWS)}",
        )


LADDER_LR_EXPONENT = -1 / 3
"""OLMo-core's peak LR ~ N^(-1/3): the ladder's default, and the analysis's reference for a fit."""


@dataclass
class LRFormula:
    """Peak LR ``coef * (N / ref_params) ** exponent``, or fitted by an LR sweep (``from_sweep``)."""

    coef: float = 0.0047 / 2
    """Peak LR at N = ref_params."""
    ref_params: float = 108e6
    """The N (parameters but the input embedding) where the peak LR is coef."""
    exponent: float = LADDER_LR_EXPONENT
    """The power of N the peak LR scales with (OLMo's -1/3); 0 = one LR for every size."""
    from_sweep: str = ""
    """A sweep dir: each size's peak LR is the fitted LR*(N, D) at the size's final horizon D
    (LR*(N) when the sweep has one horizon per size)."""

    def __post_init__(self) -> None:
        require_power_law(self)
        require(
            -2 <= self.exponent <= 0,
            "exponent",
            self.exponent,
            "must be in [-2, 0] (the peak LR falls with N: OLMo's -1/3, 0 for one LR for all)",
        )


@dataclass
class DurationFormula:
    """How long each size trains and how its LR schedule is shaped."""

    tokens_per_param: float = 20.0
    """Chinchilla-optimal tokens per parameter."""
    chinchilla_multiple: float = 4.0
    """c: each run trains 20*N*c tokens (a power of two, e.g. 4, 1, 0.25)."""
    warmup_tokens_per_param: float = 1.0
    """Warmup tokens per parameter (1: N tokens), capped at a tenth of the run."""
    schedule: str = "wsds"
    """'wsds' (decays ending at each decay point) or 'cosine' (one decay to the end)."""
    decay_points: list[float] = field(default_factory=lambda: [0.125, 0.25, 0.5, 1.0])
    """Where WSD-S decays end, as fractions of the run."""
    decay_fraction: float = 0.1
    """WSD-S: each decay's length, a fraction of the steps since the previous decay point."""
    min_lr_ratio: float = 0.0
    """Where each decay ends, as a fraction of the peak LR."""
    multiple_by_size: dict[str, float] = field(default_factory=dict)
    """Per-size c overriding ``chinchilla_multiple`` (e.g. ``{25K: 8}``): training the cheap small
    sizes longer gives them annealed points at the budgets of the larger ones, so isoFLOP
    (approach 2) budgets are covered by several sizes for little extra compute. Its names are
    checked by the ladder, which knows its own ``size_table``."""

    def __post_init__(self) -> None:
        multiples = {"chinchilla_multiple": self.chinchilla_multiple}
        multiples.update({f"multiple_by_size.{k}": v for k, v in self.multiple_by_size.items()})
        for key, c in multiples.items():
            require(c > 0 and math.log2(c).is_integer(), key, c, "must be a power of two")
        require(
            self.schedule in ("wsds", "cosine"), "schedule", self.schedule, "use 'wsds' or 'cosine'"
        )
        pts = self.decay_points
        require(
            bool(pts) and pts == sorted(set(pts)) and pts[0] > 0 and pts[-1] == 1.0,
            "decay_points",
            pts,
            "must strictly increase and end at 1.0",
        )
        require(
            0 < self.decay_fraction < 1, "decay_fraction", self.decay_fraction, "must be in (0, 1)"
        )
        require(self.tokens_per_param > 0, "tokens_per_param", self.tokens_per_param, "must be > 0")
        require(
            self.warmup_tokens_per_param >= 0,
            "warmup_tokens_per_param",
            self.warmup_tokens_per_param,
            "must be >= 0",
        )
        require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")


@dataclass
class Beta2Formula:
    """AdamW's beta2 by global batch: ``large_batch`` from ``large_batch_tokens`` on.

    OLMo-core's ladder rule (``WSDSChinchillaRunConfigurator.configure_optimizer``) since January
    2026 (allenai/OLMo-core#543), the threshold as its code sets it; before that its ladder ran
    0.95 at every size, noting that Porian et al. 2024 (their Table 4) suggest ~0.99 for small
    batches. A step, not a curve: beta2 jumps between the two neighbouring sizes whose batches
    straddle the threshold (the dry run's beta2 column shows where), so a fit across them sees an
    optimizer change with the size; one value for both (``small_batch`` = ``large_batch``) keeps
    the optimizer fixed across the ladder.
    """

    large_batch: float = 0.95
    """beta2 for batches of large_batch_tokens or more."""
    small_batch: float = 0.99
    """beta2 for smaller batches."""
    large_batch_tokens: int = 524_288
    """The global batch, in tokens, from which large_batch applies."""

    def __post_init__(self) -> None:
        for name in ("large_batch", "small_batch"):
            value = getattr(self, name)
            require(0 <= value < 1, name, value, "must be in [0, 1)")
        require(
            self.large_batch_tokens >= 1,
            "large_batch_tokens",
            self.large_batch_tokens,
            "must be >= 1",
        )


def target_batch_tokens(n: int, f: BatchFormula) -> int:
    return round(f.coef * (n / f.ref_params) ** f.exponent)


def peak_lr(n: int, f: LRFormula) -> float:
    return f.coef * (n / f.ref_params) ** f.exponent


def chinchilla_multiple(size: str, f: DurationFormula) -> float:
    return f.multiple_by_size.get(size, f.chinchilla_multiple)


def train_tokens(n: int, multiple: float, f: DurationFormula) -> int:
    return round(f.tokens_per_param * n * multiple)


def beta2_for_batch(batch_tokens: int, f: Beta2Formula) -> float:
    return f.large_batch if batch_tokens >= f.large_batch_tokens else f.small_batch
