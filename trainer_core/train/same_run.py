"""A run dir continues only the run its config describes.

Relaunched into a run dir that holds checkpoints (or a finished run), a run resumes from them or
returns the recorded result. If the settings the weights depend on changed since, it would
train on (or report) weights made with the old ones while ``config.yaml`` and ``run.json`` took
the new: the record would no longer say how the model was trained. Such a relaunch is refused.
"""

from __future__ import annotations

from trainer_core.config.diff import changed_keys
from trainer_core.config.loader import ConfigError, to_dict
from trainer_core.config.sections import TrainConfig
from trainer_core.data.shards import DataError
from trainer_core.io import storage
from trainer_core.io.records import read_yaml_record
from trainer_core.io.run_dir import config_path, read_run_json, run_json_path
from trainer_core.io.storage import Location

TRAINING_KEYS = (
    "model.",
    "optim.",
    "schedule.",
    "trainer.seed",
    "trainer.global_batch_size",
    "trainer.max_steps",
    "trainer.max_tokens",
    "data.seq_len",
    "data.tokenizer",
    "train_module.max_grad_norm",
    "train_module.z_loss_multiplier",
    "train_module.autocast_precision",
    "parallel.param_dtype",
    "parallel.float8",
)
"""What the trained weights depend on (prefixes end in a dot). The mesh, the reduction's
precision, logging, checkpoint cadence and the data's location (a moved copy of the corpus) may
change between launches."""
FREE_KEYS = frozenset({"model.attention_backend", "optim.fused"})
"""Kernels that compute the same thing."""


def check_same_run(cfg: TrainConfig, run_dir: Location) -> None:
    """Refuse ``cfg`` for ``run_dir`` when the run recorded there trained with other values of
    :data:`TRAINING_KEYS`, naming them; nothing recorded yet passes, nor a setting the record
    predates. A damaged record is refused too: with nothing to compare, the run would resume
    under whatever settings it was given."""
    path = config_path(run_dir)
    if not storage.is_file(path):
        return
    recorded = read_yaml_record(path)
    changed = [
        key
        for key in changed_keys(recorded, to_dict(cfg), one_side=False)
        if key.startswith(TRAINING_KEYS) and key not in FREE_KEYS
    ]
    if changed:
        raise ChangedRunError(path, changed)


class ChangedRunError(ConfigError):
    """A relaunch whose settings differ, in ``changed`` (dotted run keys), from the run recorded
    at ``path``: a ladder or sweep words it in its own keys (:func:`~trainer_core.ray.tune_run.
    check_unchanged_runs`)."""

    def __init__(self, path: Location, changed: list[str]):
        self.path, self.changed = path, changed
        super().__init__(
            f"trainer.run_dir: {path} records a run trained with other {', '.join(changed)}; "
            "going on would keep its weights under the new settings: give the changed run a new "
            "run dir (checkpoint.resume_from branches it from one of this run's checkpoints), "
            "or undo the change"
        )


def check_same_data(data_id: str, run_dir: Location) -> None:
    """Refuse to go on in ``run_dir`` (from its own checkpoints) when its run trained on data
    with another content id: the checkpoints' data position would index into other tokens, with
    no error. A record without an id (written before runs kept one) passes."""
    recorded = (read_run_json(run_dir) or {}).get("data_id") or ""
    if recorded and data_id and recorded != data_id:
        raise DataError(
            f"trainer.run_dir: {run_json_path(run_dir)} records a run trained on other data "
            f"(content id {recorded}, now {data_id}: the shards at data.shards / data.mix were "
            "re-tokenized or reweighted since); resume it on the data it started on, or give the "
            "run on the new data a new run dir (checkpoint.resume_from branches it)"
        )
