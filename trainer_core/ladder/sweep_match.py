"""Whether a sweep's optimum was found under the settings a ladder reuses it with.

An LR optimum belongs to its schedule, optimizer, model and batch: a sweep under WSD-S with 20%
decays, or at 4x the batch, says little about the peak LR of a cosine run, yet
``lr.from_sweep`` would plan with it unasked. The settings that move the optimum are compared
with the sweep's, as its trials ran them (``experiment.yaml``, its duration as the sweep made it:
a WSD-S schedule where its trials decay at several horizons); the differences are one warning
per sweep, so the user either matches them or sweeps again.
"""

from __future__ import annotations

from typing import Any

from trainer_core.config.loader import ConfigError, from_dict, to_dict
from trainer_core.io import storage
from trainer_core.io.records import read_yaml_record
from trainer_core.io.run_dir import EXPERIMENT
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.lr_feedback import BATCH_KEY, LR_KEY
from trainer_core.ladder.sweep import SweepConfig, sweep_durations

SHAPING = (
    "seq_len",
    "duration.schedule",
    "duration.decay_fraction",
    "duration.min_lr_ratio",
    "duration.warmup_tokens_per_param",
    "beta2.large_batch",
    "beta2.small_batch",
    "beta2.large_batch_tokens",
    "run.optim.beta1",
    "run.optim.eps",
    "run.optim.weight_decay",
    "run.optim.decay_norms_and_biases",
    "run.optim.decay_embeddings",
    "run.train_module.max_grad_norm",
    "run.train_module.z_loss_multiplier",
    "run.model.qk_norm",
    "run.model.init_std",
)
"""The settings an LR or batch optimum depends on, beside N and D."""
BATCH_RULE = ("batch.coef", "batch.ref_params", "batch.exponent")
"""The batch an LR optimum was found at, where the sweep did not vary it."""


def sweep_mismatches(ladder: LadderConfig) -> list[str]:
    """One warning per sweep the ladder takes a law from, naming each setting in which the two
    differ (a setting the sweep's record lacks is not compared: it can't say)."""
    keys: dict[str, list[str]] = {}
    for key, sweep_dir in ((LR_KEY, ladder.lr.from_sweep), (BATCH_KEY, ladder.batch.from_sweep)):
        if sweep_dir:
            keys.setdefault(sweep_dir, []).append(key)
    ours = to_dict(ladder)
    warnings = []
    for sweep_dir, named in keys.items():
        by = " and ".join(named)
        record_path = storage.join(storage.as_location(sweep_dir), EXPERIMENT)
        if not storage.is_file(record_path):
            warnings.append(
                f"{by}: {sweep_dir} holds no {EXPERIMENT}, so its settings can't be compared "
                "with this ladder's: make sure its schedule, optimizer and batch were these"
            )
            continue
        record = read_yaml_record(record_path)
        theirs = _as_trained(type(ladder), record)
        compared = SHAPING
        if BATCH_KEY not in named and not _swept_batch(record):
            compared += BATCH_RULE
        differ = [
            f"{name} {_get(theirs, name)!r} (here {_get(ours, name)!r})"
            for name in compared
            if _get(theirs, name) is not MISSING and _get(theirs, name) != _get(ours, name)
        ]
        if differ:
            warnings.append(
                f"{by}: {sweep_dir} was swept with {', '.join(differ)}: its optimum may not "
                "hold under this ladder's settings; set them as the sweep had them, or sweep "
                "again with this ladder's"
            )
    return warnings


def _as_trained(ladder_type: type, record: dict[str, Any]) -> dict[str, Any]:
    """The sweep's settings as its trials ran them; the record as written where it no longer
    decodes (a sweep recorded by another version)."""
    try:
        swept = from_dict(ladder_type, {k: v for k, v in record.items() if k != "sweep"})
        sweep = from_dict(SweepConfig, record.get("sweep") or {})
    except ConfigError:
        return record
    return to_dict(sweep_durations(swept, sweep)[0])


def _swept_batch(record: dict[str, Any]) -> bool:
    factors = _get(record, "sweep.batch_factors")
    return factors is not MISSING and len(set(factors or [1.0])) > 1


MISSING = object()
"""What :func:`_get` gives for a key the record lacks (None is a value: no clipping, no z-loss)."""


def _get(record: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(record, dict) or part not in record:
            return MISSING
        record = record[part]
    return record
