"""The model size table: named sizes -> transformer dimensions.

Names are the approximate parameter count of the transformer blocks alone (embeddings and
LM head depend on the vocabulary). The exact non-embedding count ``N`` used by ladder formulas is
computed from these dims and the vocabulary by :func:`trainer_core.model.counts.count_params`.
CPU sizes (15K-50M) run in tests and the demo. Each ladder's sizes are one shape family, so a
fit across them, and its held-out largest size, measure scale and not a change of shape: the
demo's and the CPU reference ladder's (15K-400K) keep 2 layers, head dim 16 (12 at 15K) and an
MLP 2.7-3x d_model; the GPU ladder's (100M-1B), as OLMo's ladder, 16 layers and an MLP 4x
d_model (head dim 64, and 128 at 1B, OLMo-core's 1B); only the width grows. 3B and 7B are
Llama shapes with grouped key/value heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainer_core.config.decode import ConfigError, repeated, suggest


@dataclass(frozen=True)
class SizeSpec:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int


MODEL_SIZES: dict[str, SizeSpec] = {
    "15K": SizeSpec(24, 2, 2, 2, 64),
    "25K": SizeSpec(32, 2, 2, 2, 96),
    "50K": SizeSpec(48, 2, 3, 3, 128),
    "100K": SizeSpec(64, 2, 4, 4, 176),
    "200K": SizeSpec(96, 2, 6, 6, 256),
    "300K": SizeSpec(80, 4, 5, 5, 224),
    "400K": SizeSpec(128, 2, 8, 8, 352),
    "600K": SizeSpec(96, 6, 6, 6, 240),
    "1M": SizeSpec(128, 4, 4, 4, 384),
    "3M": SizeSpec(192, 6, 6, 6, 512),
    "5M": SizeSpec(256, 6, 4, 4, 704),
    "10M": SizeSpec(320, 8, 5, 5, 896),
    "20M": SizeSpec(384, 12, 6, 6, 1024),
    "50M": SizeSpec(512, 16, 8, 8, 1408),
    "100M": SizeSpec(640, 16, 10, 10, 2560),
    "200M": SizeSpec(896, 16, 14, 14, 3584),
    "400M": SizeSpec(1280, 16, 20, 20, 5120),
    "700M": SizeSpec(1664, 16, 26, 26, 6656),
    "1B": SizeSpec(2048, 16, 16, 16, 8192),
    "3B": SizeSpec(3072, 28, 24, 8, 8192),
    "7B": SizeSpec(4096, 32, 32, 8, 14336),
}


def check_size(name: str, field: str, custom: Mapping[str, SizeSpec] | None = None) -> None:
    """Raise a ConfigError naming ``field`` (and the closest known size) for an unknown size;
    ``custom``: a ladder's ``size_table``, known beside the built-in one."""
    known = [*MODEL_SIZES, *(custom or {})]
    if name not in known:
        raise ConfigError(
            f"{field}: {name!r} is not in the size table{suggest(name, known)}; known sizes: "
            f"{', '.join(known)} (a ladder's size_table adds its own)"
        )


def check_sizes(names: list[str], field: str, custom: Mapping[str, SizeSpec] | None = None) -> None:
    """Every name a known size, none twice (two runs of one size would share a run dir)."""
    for name in names:
        check_size(name, field, custom)
    twice = repeated(names)
    if twice:
        raise ConfigError(
            f"{field}: {', '.join(twice)} listed more than once; each size is one run (its run "
            "dir named by the size): list it once"
        )
