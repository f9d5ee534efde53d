from __future__ import annotations

import textwrap

import pytest

from trainer_core.config.loader import ConfigError, load_config, to_dict, to_yaml
from trainer_core.config.sections import TrainConfig


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
            ["--train_module.rank_microbatch_seqs=3"],
            "trainer.global_batch_size: 2048 is not allowed; it has 16 sequences, not a multiple "
            "of train_module.rank_microbatch_seqs=3",
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


def test_to_dict_is_plain_data():
    data = to_dict(TrainConfig())
    assert data["model"]["size"] == "1M" and isinstance(data["checkpoint"]["keep"], list)


def test_include_cycle_is_named_with_its_chain(tmp_path):
    write(tmp_path / "a.yaml", "optim: !include b.yaml\n")
    write(tmp_path / "b.yaml", "lr: !include sub/c.yaml\n")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "c.yaml", "x: !include ../b.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, tmp_path / "a.yaml")
    chain = " -> ".join(str(tmp_path / n) for n in ("a.yaml", "b.yaml", "sub/c.yaml", "b.yaml"))
    assert str(err.value) == f"!include cycle: {chain}; remove one of these includes"


def test_a_file_included_twice_without_a_cycle_is_fine(tmp_path):
    write(tmp_path / "lr.yaml", "0.01\n")
    write(tmp_path / "run.yaml", "optim: {lr: !include lr.yaml, eps: !include lr.yaml}\n")
    cfg = load_config(TrainConfig, tmp_path / "run.yaml")
    assert cfg.optim.lr == cfg.optim.eps == 0.01


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "inf", "nan", "1e999"])
def test_non_finite_numbers_are_rejected_naming_the_key(text):
    with pytest.raises(ConfigError, match=r"^optim\.lr: .* is not a finite number$"):
        load_config(TrainConfig, None, [f"--optim.lr={text}"])


def test_non_finite_number_in_yaml_names_the_key(tmp_path):
    write(tmp_path / "run.yaml", "schedule: {min_lr_ratio: .nan}\n")
    with pytest.raises(ConfigError, match=r"^schedule\.min_lr_ratio: nan is not a finite number"):
        load_config(TrainConfig, tmp_path / "run.yaml")


@pytest.mark.parametrize("text", ["123", "1e3", "007", "0x1F", "3.50", "true", "null"])
def test_a_string_field_takes_the_override_as_typed(text):
    cfg = load_config(TrainConfig, None, [f"--tracking.name={text}"])
    assert cfg.tracking.name == text


def test_other_fields_still_read_the_override_as_yaml():
    cfg = load_config(TrainConfig, None, ["--optim.lr=1e-3", "--checkpoint.resume_from=12"])
    assert cfg.optim.lr == 1e-3 and cfg.checkpoint.resume_from == "12"
    assert (
        load_config(
            TrainConfig, None, ["--trainer.max_steps=null", "--trainer.max_tokens=4096"]
        ).trainer.max_steps
        is None
    )


def test_a_number_in_yaml_for_a_string_field_says_to_quote_it(tmp_path):
    write(tmp_path / "run.yaml", "tracking: {name: 123}\n")
    with pytest.raises(ConfigError, match=r"^tracking\.name: expected a string, got 123; quote it"):
        load_config(TrainConfig, tmp_path / "run.yaml")


@pytest.mark.parametrize("override", ["--lr..coef=1", "--=3", "--optim.=1", "--.optim.lr=1"])
def test_an_override_with_an_empty_key_name_is_one_line_naming_it(override):
    """Once the whole config's mapping, printed as the error."""
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, [override])
    assert str(err.value) == (
        f"override {override!r} has an empty key name: write --section.key=value"
    )
