from __future__ import annotations

import pytest

from trainer_core.config.loader import ConfigError, from_dict
from trainer_core.config.sections import TrainConfig


def test_max_tokens_duration_rounds_up():
    cfg = from_dict(TrainConfig, {"trainer": {"max_steps": None, "max_tokens": 10_000}})
    assert cfg.total_steps == 5  # 10000 / 2048 tokens per step, rounded up
    with pytest.raises(ConfigError, match="set exactly one of max_steps and max_tokens"):
        from_dict(TrainConfig, {"trainer": {"max_tokens": 10_000}})
