from __future__ import annotations

import textwrap

import pytest

from trainer_core.cli import split_args
from trainer_core.config import TrainConfig
from trainer_core.configio import ConfigError, from_dict, load_config, to_dict, to_yaml


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_yaml_with_include_and_overrides(tmp_path):
    write(tmp_path / "optim.yaml", "lr: 0.01\nweight_decay: 0.0\n")
    cfg_file = write(
        tmp_path / "run.yaml",
        """
        model: {size: 3M}
        optim: !include optim.yaml
        trainer: {max_steps: 50}
        """,
    )
    cfg = load_config(TrainConfig, cfg_file, ["--optim.lr=3e-4", "--trainer.seed=7"])
    assert cfg.model.size == "3M" and cfg.model.d_model == 192
    assert cfg.optim.lr == pytest.approx(3e-4)
    assert cfg.optim.weight_decay == 0.0
    assert cfg.trainer.max_steps == 50 and cfg.trainer.seed == 7


def test_round_trip_dump_and_reload(tmp_path):
    cfg = load_config(
        TrainConfig, None, ["--checkpoint.keep=[{every: 10, until: 100}, {every: 50}]"]
    )
    path = tmp_path / "dump.yaml"
    path.write_text(to_yaml(cfg))
    again = load_config(TrainConfig, path)
    assert again == cfg
    assert again.checkpoint.keep[0].every == 10 and again.checkpoint.keep[1].until is None


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["--optim.lrr=1e-3"], "optim.lrr: unknown key (did you mean 'lr'?)"),
        (["--optim.lr=0"], "optim.lr: 0.0 is not allowed; must be > 0"),
        (["--optim.lr=fast"], "optim.lr: expected a number, got 'fast'"),
        (["--trainer.max_steps=ten"], "trainer.max_steps: 'ten' is not a valid integer or null"),
        (["--model.size=2M"], "model.size: '2M' is not in the size table (did you mean '20M'?)"),
        (["--schedule.kind=cosin"], "schedule.kind: 'cosin' is not allowed; use one of 'constant'"),
        (
            ["--trainer.global_batch_size=1000"],
            "trainer.global_batch_size: 1000 is not allowed; must be a multiple of data.seq_len=128",
        ),
        (
            ["--train_module.rank_microbatch_size=768"],
            "trainer.global_batch_size: 2048 is not allowed; must be divisible by "
            "train_module.rank_microbatch_size=768",
        ),
        (
            ["--schedule.warmup=300"],
            "schedule.warmup: 300.0 is not allowed; warmup must be shorter than the run (200 steps)",
        ),
        (["--modle.size=1M"], "modle: unknown key (did you mean 'model'?)"),
    ],
)
def test_bad_values_name_the_path(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, overrides)
    assert expected in str(err.value)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(TrainConfig, tmp_path / "nope.yaml")
    bad = write(tmp_path / "bad.yaml", "model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(TrainConfig, bad)
    inc = write(tmp_path / "inc.yaml", "optim: !include missing.yaml\n")
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config(TrainConfig, inc)


def test_max_tokens_duration_rounds_up():
    cfg = from_dict(TrainConfig, {"trainer": {"max_steps": None, "max_tokens": 10_000}})
    assert cfg.total_steps == 5  # 10000 / 2048 tokens per step, rounded up
    with pytest.raises(ConfigError, match="set exactly one of max_steps and max_tokens"):
        from_dict(TrainConfig, {"trainer": {"max_tokens": 10_000}})


def test_cli_split_accepts_space_and_equals_forms():
    own, overrides = split_args(
        ["--config", "a.yaml", "--optim.lr", "1e-3", "--trainer.seed=3"], {"--config": True}
    )
    assert own == {"--config": "a.yaml"}
    assert overrides == ["--optim.lr=1e-3", "--trainer.seed=3"]
    with pytest.raises(ConfigError, match="unknown argument 'oops'"):
        split_args(["oops"], {"--config": True})


def test_to_dict_is_plain_data():
    data = to_dict(TrainConfig())
    assert data["model"]["size"] == "1M" and isinstance(data["checkpoint"]["keep"], list)
