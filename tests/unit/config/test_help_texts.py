"""--help shows each field's attribute docstring: every setting a user can give has one."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator

import pytest

from trainer_core.config.cli import attribute_docs, help_text
from trainer_core.config.loader import ConfigError
from trainer_core.ray.ladder_run import LadderJobConfig, benchmark_size
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.ray.sweep_run import SweepJobConfig


def own_doc(cls: type) -> str:
    """``cls``'s docstring, not the signature dataclass writes where it has none."""
    doc = cls.__dict__.get("__doc__") or ""
    return "" if doc.startswith(f"{cls.__name__}(") else doc


def undocumented(cls: type, prefix: str = "") -> Iterator[str]:
    """Dotted keys --help would show bare: a setting without a docstring, or a section with
    neither a docstring of its own nor one on the field holding it."""
    docs = attribute_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            if not (docs.get(f.name) or own_doc(kind)):
                yield f"{prefix}{f.name} ({kind.__name__})"
            yield from undocumented(kind, f"{prefix}{f.name}.")
        elif not docs.get(f.name, "").strip():
            yield prefix + f.name


@pytest.mark.parametrize("cls", [RayTrainConfig, LadderJobConfig, SweepJobConfig])
def test_every_setting_of_the_entry_points_configs_has_a_docstring(cls):
    """workflows/train.py, ladder.py and lr_sweep.py showed 49-57 options with a default alone
    (``--device_memory_gb (default: None)``), and an empty SweepConfig heading."""
    assert list(undocumented(cls)) == []


@pytest.mark.parametrize("cls", [RayTrainConfig, LadderJobConfig, SweepJobConfig])
def test_help_renders_with_every_docstring(cls):
    """argparse formats help strings with %: a docstring's bare "20%" broke --help."""
    text = help_text("python x.py", cls)
    if cls is SweepJobConfig:
        assert "SweepConfig ['sweep']:\n  The LR (and batch) sweep:" in text


def test_help_says_what_a_zero_or_null_default_means_and_addresses_users():
    text = " ".join(help_text("python x.py", LadderJobConfig).split())
    assert "--device_memory_gb [float] Memory per device in GiB; null = the device table's" in text
    train = " ".join(help_text("python x.py", RayTrainConfig).split())
    assert "--model.d_model int Residual stream width; 0 = the size table's." in train
    assert "--trainer.run_dir str Where this run writes its checkpoints" in train
    assert "run_location" not in train


def test_an_unknown_benchmark_size_names_the_benchmark_flag():
    """``workflows/ladder.py --benchmark 7K`` said "sizes: '7K' is not in the size table", a key
    the user never set."""
    with pytest.raises(ConfigError, match=r"^--benchmark: '7K' is not in the size table"):
        benchmark_size(LadderJobConfig(), "7K")
