from __future__ import annotations

import pytest

from trainer_core.config.loader import ConfigError, from_dict
from trainer_core.config.sections import TrainConfig


def test_max_tokens_duration_rounds_up():
    cfg = from_dict(TrainConfig, {"trainer": {"max_steps": None, "max_tokens": 10_000}})
    assert cfg.total_steps == 5  # 10000 / 2048 tokens per step, rounded up
    with pytest.raises(ConfigError, match="set exactly one of max_steps and max_tokens"):
        from_dict(TrainConfig, {"trainer": {"max_tokens": 10_000}})


@pytest.mark.parametrize(
    "data, message",
    [
        ({"model": {"n_kv_heads": -1}}, "model.n_kv_heads: -1 is not allowed; must be >= 0"),
        ({"model": {"rope_theta": 0.0}}, "model.rope_theta: 0.0 is not allowed; must be > 0"),
        ({"model": {"init_std": -1.0}}, "model.init_std: -1.0 is not allowed; must be > 0"),
        ({"model": {"norm_eps": -1.0}}, "model.norm_eps: -1.0 is not allowed; must be >= 0"),
        (
            {"train_module": {"z_loss_multiplier": -1.0}},
            "train_module.z_loss_multiplier: -1.0 is not allowed; must be >= 0 or null",
        ),
        (
            {"trainer": {"peak_flops_per_device": -1.0}},
            "trainer.peak_flops_per_device: -1.0 is not allowed; must be > 0 or null",
        ),
    ],
)
def test_a_run_number_out_of_range_is_an_error_naming_its_key(data, message):
    """Each was once accepted: a negative head count or init std failed in torch with a trace, a
    zero RoPE base or negative norm epsilon trained to a NaN loss blamed on the LR, and a negative
    z-loss or peak FLOP/s ran on (the latter logging a negative MFU)."""
    with pytest.raises(ConfigError) as err:
        from_dict(TrainConfig, data)
    assert str(err.value).startswith(message)


def test_max_tokens_alone_says_how_to_unset_the_default_max_steps():
    """max_steps has a default, so setting max_tokens alone set both."""
    with pytest.raises(ConfigError) as err:
        from_dict(TrainConfig, {"trainer": {"max_tokens": 10_000}})
    assert str(err.value) == (
        "trainer.max_steps: 200 is not allowed; set exactly one of max_steps and max_tokens; "
        "max_steps defaults to 200: add --trainer.max_steps=null (max_steps: null in a file)"
    )
    with pytest.raises(ConfigError) as err:
        from_dict(TrainConfig, {"trainer": {"max_steps": None}})
    assert str(err.value) == (
        "trainer.max_steps: None is not allowed; set exactly one of max_steps and max_tokens"
    )
