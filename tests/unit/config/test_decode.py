from __future__ import annotations

import textwrap
from dataclasses import dataclass

import draccus
import pytest
import yaml
from draccus.parsers.yaml_loader import SafeLoaderWithInclusion
from draccus.utils import DecodingError, ParsingError

from trainer_core.config.decode import ConfigError, from_dict, load_yaml
from trainer_core.config.loader import load_config
from trainer_core.config.sections import TrainConfig
from trainer_core.ladder.config import LadderConfig

OPTIM_KEYS = "lr, beta1, beta2, eps, weight_decay, decay_norms_and_biases, decay_embeddings, fused"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def error(cls, data):
    with pytest.raises(ConfigError) as err:
        from_dict(cls, data)
    return str(err.value)


@dataclass
class Rule:
    every: int
    until: int = 0

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ConfigError("every: must be >= 1")


def test_draccus_wording_we_parse_is_unchanged():
    """An upgrade that rewords these errors fails here, not as a traceback for a user."""
    with pytest.raises(DecodingError) as unknown:
        draccus.decode(Rule, {"every": 1, "evry": 2, "x": 3})
    assert unknown.value.message == "The fields `evry`, `x` are not valid for Rule"
    with pytest.raises(DecodingError) as missing:
        draccus.decode(Rule, {"until": 2})
    assert missing.value.message == "Missing required field(s) `every` for Rule"
    with pytest.raises(ParsingError) as check:
        draccus.decode(Rule, {"every": 0})
    assert str(check.value.__cause__) == "every: must be >= 1"


def test_draccus_yaml_loader_merges_an_included_mapping(tmp_path):
    """Our include loader subclasses draccus's safe one for its ``<<: !include`` merge."""
    assert issubclass(SafeLoaderWithInclusion, yaml.SafeLoader)
    write(tmp_path / "base.yaml", "optim: {lr: 0.02}\ntrainer: {max_steps: 30, seed: 1}\n")
    write(tmp_path / "run.yaml", "<<: !include base.yaml\ntrainer: {max_steps: 40}\n")
    assert load_yaml(tmp_path / "run.yaml") == {
        "optim": {"lr": 0.02},
        "trainer": {"max_steps": 40},
    }
    cfg = load_config(TrainConfig, tmp_path / "run.yaml")
    assert (cfg.optim.lr, cfg.trainer.max_steps, cfg.trainer.seed) == (0.02, 40, 0)


def test_a_cycle_through_a_merge_include_is_named(tmp_path):
    write(tmp_path / "a.yaml", "<<: !include b.yaml\n")
    write(tmp_path / "b.yaml", "<<: !include a.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_yaml(tmp_path / "a.yaml")
    chain = " -> ".join(str(tmp_path / n) for n in ("a.yaml", "b.yaml", "a.yaml"))
    assert str(err.value) == f"!include cycle: {chain}; remove one of these includes"


def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path):
    bad = write(tmp_path / "sub" / "bad.yaml", "lr: [1, 2\n")
    write(tmp_path / "run.yaml", "optim: !include sub/bad.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_yaml(tmp_path / "run.yaml")
    assert str(err.value).startswith(
        f"config file '{bad}' is not valid YAML: while parsing a flow sequence\n"
        f'  in "{bad}", line 1, column 5\n'
    )


@pytest.mark.parametrize(
    "data, expected",
    [
        (
            {"optim": {"lrr": 1e-3}},
            f"optim.lrr: unknown key (did you mean 'lr'?); allowed keys: {OPTIM_KEYS}",
        ),
        ({"optim": {"lr": "fast"}}, "optim.lr: expected a number, got 'fast'"),
        ({"optim": {"lr": -1.0}}, "optim.lr: -1.0 is not allowed; must be > 0"),
        ({"optim": 5}, "optim: expected a mapping for OptimConfig, got 5"),
        ({"trainer": {"seed": None}}, "trainer.seed: expected an integer, got None"),
        ({"trainer": {"seed": "12"}}, "trainer.seed: expected an integer, got '12'"),
        ({"trainer": {"progress": "yes"}}, "trainer.progress: expected true or false, got 'yes'"),
        ({"tracking": {"name": 123}}, "tracking.name: expected a string, got 123; quote it"),
        ({"tracking": {"tags": "a"}}, "tracking.tags: expected a list of string, got 'a'"),
        (
            {"train_module": {"autocast_precision": "fp16"}},
            "train_module.autocast_precision: 'fp16' is not a valid one of 'bf16' or null",
        ),
        (
            {"checkpoint": {"keep": [{"every": 5}, {"every": 0}]}},
            "checkpoint.keep[1].every: 0 is not allowed; must be >= 1",
        ),
        (
            {"checkpoint": {"keep": [{"every": 5}, 7]}},
            "checkpoint.keep[1]: expected a mapping for KeepRule, got 7",
        ),
        (
            {"checkpoint": {"keep": [{"until": 9}]}},
            "checkpoint.keep[0].every: required (there is no default)",
        ),
    ],
)
def test_each_mistake_is_one_line_naming_the_key(data, expected):
    assert error(TrainConfig, data) == expected


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"seed": 3}, "seed: this key moved; set run.trainer.seed instead"),
        (
            {"run": {"optim": {"lr": 0.1}}},
            "run.optim.lr: the ladder plans it from lr for every size; remove run.optim.lr (or set lr)",
        ),
        (
            {"run": {"model": {"n_heads": 5}}},
            "run.model.n_heads: 5 is not allowed; must divide d_model=128",
        ),
        (
            {"run": {"trainer": {"global_batch_size": 1000}}},
            "run.trainer.global_batch_size: 1000 is not allowed; must be a multiple of "
            "data.seq_len=128 (it counts tokens)",
        ),
        (
            {"lr": {"coeff": 1}},
            "lr.coeff: unknown key (did you mean 'coef'?); allowed keys: "
            "coef, ref_params, exponent, from_sweep",
        ),
    ],
)
def test_ladder_mistakes_name_the_key_and_the_run_template_path(data, expected):
    assert error(LadderConfig, data) == expected


def test_values_decode_as_before_draccus():
    cfg = load_config(
        TrainConfig,
        None,
        ["--trainer.max_steps=null", "--trainer.max_tokens=2e6", "--data.shards=include/shards"],
    )
    assert cfg.trainer.max_tokens == 2_000_000 and isinstance(cfg.trainer.max_tokens, int)
    assert cfg.data.shards == "include/shards"
    assert from_dict(TrainConfig, {"trainer": {"max_steps": 20.0}}).trainer.max_steps == 20
    cfg = load_config(TrainConfig, None, ["--checkpoint.keep=[{every: 50}]", "--optim.fused=null"])
    assert cfg.checkpoint.keep[0].every == 50 and cfg.optim.fused is None
    assert load_config(TrainConfig, None, ["--tracking.name=null"]).tracking.name == "null"


def test_a_file_not_in_utf8_is_one_line_naming_the_file_and_byte(tmp_path):
    """Once a UnicodeDecodeError traceback, from the file itself, an include, or a binary file."""
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: café\n".encode("latin-1"))
    png = tmp_path / "image.yaml"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    write(tmp_path / "run.yaml", "optim: !include latin1.yaml\n")
    for path, failing, byte in [
        (latin1, latin1, 9),
        (tmp_path / "run.yaml", latin1, 9),
        (png, png, 0),
    ]:
        with pytest.raises(ConfigError) as err:
            load_yaml(path)
        assert (
            str(err.value)
            == f"config file '{failing}' is not UTF-8 (byte {byte}): save it as UTF-8"
        )


def test_a_directory_given_as_config_file_is_named_as_one(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(LadderConfig, tmp_path)
    assert str(err.value) == f"config file '{tmp_path}' is a directory: give a YAML file"


def test_a_key_written_twice_in_one_mapping_is_refused_naming_file_and_lines(tmp_path):
    """PyYAML keeps the last one: ``coef`` silently went back to its default."""
    path = write(tmp_path / "ladder.yaml", "lr: {coef: 0.5}\nname: x\nlr: {exponent: -0.5}\n")
    with pytest.raises(ConfigError) as err:
        load_config(LadderConfig, path)
    assert str(err.value) == (
        f"{path}:3: key 'lr' appears twice in one mapping (first on line 1); keep one"
    )
    write(tmp_path / "flow.yaml", "lr: {coef: 0.5, coef: 0.6}\n")
    with pytest.raises(ConfigError, match=r"flow\.yaml:1: key 'coef' appears twice"):
        load_yaml(tmp_path / "flow.yaml")


def test_a_key_may_still_override_a_merged_one(tmp_path):
    write(tmp_path / "base.yaml", "lr: {coef: 0.5}\nname: base\n")
    write(tmp_path / "run.yaml", "<<: !include base.yaml\nname: run\n")
    write(tmp_path / "anchor.yaml", "a: &a {coef: 1}\nb: {<<: *a, coef: 2}\n")
    assert load_yaml(tmp_path / "run.yaml") == {"lr": {"coef": 0.5}, "name": "run"}
    assert load_yaml(tmp_path / "anchor.yaml") == {"a": {"coef": 1}, "b": {"coef": 2}}


def test_integers_in_scientific_notation_in_yaml_as_on_the_command_line(tmp_path):
    """YAML 1.1 reads ``65e3`` as a string (its floats need a dot and a signed exponent)."""
    path = write(tmp_path / "ladder.yaml", "eval_tokens: 65e3\nrun: {trainer: {seed: 1E1}}\n")
    cfg = load_config(LadderConfig, path)
    assert (cfg.eval_tokens, cfg.run.trainer.seed) == (65_000, 10)
    path = write(tmp_path / "run.yaml", "trainer: {max_steps: null, max_tokens: 2e6}\n")
    assert load_config(TrainConfig, path).trainer.max_tokens == 2_000_000


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"trainer": {"seed": "2.5e0"}}, "trainer.seed: expected an integer, got '2.5e0'"),
        ({"trainer": {"seed": "1e999"}}, "trainer.seed: expected an integer, got '1e999'"),
        ({"trainer": {"seed": 2.5}}, "trainer.seed: expected an integer, got 2.5"),
        (
            {"trainer": {"max_steps": None, "max_tokens": "abc"}},
            "trainer.max_tokens: 'abc' is not a valid integer or null",
        ),
    ],
)
def test_a_number_that_is_not_whole_is_still_refused_for_an_integer(data, expected):
    assert error(TrainConfig, data) == expected


def test_a_whole_file_of_another_entry_points_config_is_recognised():
    """Once "model: unknown key; allowed keys: name, ..." and "name: unknown key; ...": neither
    said the file was a run's config given to a ladder, or a ladder's given to a run."""
    run_file = {"model": {"size": "1M"}, "data": {"seq_len": 64}, "trainer": {"max_steps": 20}}
    assert error(LadderConfig, run_file) == (
        "model: unknown key; model, data, trainer are sections of `run:` (a TrainConfig): this "
        "looks like another entry point's config; run it with that one, or put these sections "
        "under `run:`"
    )
    ladder_file = {"name": "demo", "sizes": ["1M"], "run": {"trainer": {"max_steps": 20}}}
    assert error(TrainConfig, ladder_file) == (
        "name: unknown key; this file has this entry point's sections under `run:`: it looks like "
        "the config of another entry point, which runs `run:`; run it with that one, or give this "
        "one only what is under `run:`"
    )
    old_ladder = {"data": {"seq_len": 64}, "tracking": {"wandb": True}}
    assert error(LadderConfig, old_ladder) == "data: this key moved; set run.data instead"


@pytest.mark.parametrize(
    "cls, data, expected",
    [
        (
            LadderConfig,
            {"trainer": {"log_interval": 5}},
            "trainer: unknown key here; trainer is a section of run: write "
            "run.trainer.log_interval",
        ),
        (
            LadderConfig,
            {"trainer": {"log_interval": 5, "seed": 1}},
            "trainer: unknown key here; trainer is a section of run: write run.trainer",
        ),
        (
            LadderConfig,
            {"run": {"lr": {"coef": 1}}},
            "run.lr: unknown key here; lr is a section at the top level: write lr.coef",
        ),
        (
            LadderConfig,
            {"run": {"beta2": 0.99}},
            "run.beta2: unknown key here; beta2 is a field of run.optim: write run.optim.beta2",
        ),
        (
            LadderConfig,
            {"coef": 1},
            "coef: unknown key here; coef is a field of batch and of lr: write batch.coef or "
            "lr.coef",
        ),
        (
            TrainConfig,
            {"lr": 0.001},
            "lr: unknown key here; lr is a field of optim: write optim.lr",
        ),
    ],
)
def test_a_key_at_the_wrong_level_names_its_full_path(cls, data, expected):
    """Once the closest sibling's name ("trainer: unknown key (did you mean 'duration'?)") or
    no hint at all (``lr`` in a run's file, ``run.lr.coef`` in a ladder's)."""
    assert error(cls, data) == expected


@pytest.mark.parametrize(
    "cls, overrides, expected",
    [
        (
            LadderConfig,
            ["--duration.multiple_by_size={15K:2}"],
            "duration.multiple_by_size: '15K:2' has no value; write {15K: 2} (a space after the "
            "colon, quoted in the shell)",
        ),
        (
            TrainConfig,
            ["--trainer={seed:3}"],
            "trainer: 'seed:3' has no value; write {seed: 3} (a space after the colon, quoted in "
            "the shell)",
        ),
    ],
)
def test_a_colon_without_a_space_says_so(cls, overrides, expected):
    """YAML reads ``{15K:2}`` as the key "15K:2" with no value: the error was
    "duration.multiple_by_size.15K:2: expected a number, got None"."""
    with pytest.raises(ConfigError) as err:
        load_config(cls, None, overrides)
    assert str(err.value) == expected
