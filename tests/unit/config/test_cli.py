from __future__ import annotations

import dataclasses
import re
import typing
import warnings

import pytest

from trainer_core.config.cli import (
    exit_on_error,
    field_doc,
    help_text,
    parse_command,
    plain_text,
    split_args,
)
from trainer_core.config.loader import ConfigError, load_config
from trainer_core.config.sections import TrainConfig
from trainer_core.errors import RunWarning
from trainer_core.ladder.config import LadderConfig
from trainer_core.ray.ladder_run import LadderJobConfig
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.ray.sweep_run import SweepJobConfig


def test_cli_split_accepts_space_and_equals_forms():
    own, overrides = split_args(
        ["--config", "a.yaml", "--optim.lr", "1e-3", "--trainer.seed=3"], {"--config": True}
    )
    assert own == {"--config": "a.yaml"}
    assert overrides == ["--optim.lr=1e-3", "--trainer.seed=3"]
    with pytest.raises(ConfigError, match="unknown argument 'oops'"):
        split_args(["oops"], {"--config": True})


def leaf_fields(cls, prefix=""):
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            yield from leaf_fields(tp, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


def help_rows(cls: type) -> dict[str, str]:
    """``help_text``'s row of each field of ``cls`` (dotted key -> its text on one line)."""
    text = help_text("python x.py", cls).split(f"\n{cls.__qualname__}:\n", 1)[1]
    rows = [" ".join(row.split()) for row in re.split(r"\n(?=  --)", text)[1:]]
    return {row.split()[0][2:]: row for row in rows}


def test_help_is_draccus_with_every_default_and_none_of_its_own_options():
    """Relies on draccus's parser internals (``_action_groups``, the "Config file for" rows): an
    upgrade that changes them fails here."""
    text = help_text("python x.py [--config FILE] [overrides]", LadderConfig)
    assert text.startswith("usage: python x.py [--config FILE] [overrides]\n")
    rows = help_rows(LadderConfig)
    assert rows["run.optim.lr"].startswith("--run.optim.lr float ")
    assert rows["run.optim.lr"].endswith(" (default: 0.003)")
    assert rows["sizes"].startswith("--sizes list[str] ")
    assert rows["sizes"].endswith(" (default: ['1M', '3M', '5M'])")
    assert "Config file for" not in text and "config_path" not in text
    assert "\n  --run.model str" not in text and "\n  --batch str" not in text
    rows = re.split(r"\n(?=  --)", text.split("\nLadderConfig:\n", 1)[1])[1:]
    assert [r.split()[0] for r in rows] == [f"--{name}" for name in leaf_fields(LadderConfig)]
    assert [r.split()[0] for r in rows if "(default: " not in " ".join(r.split())] == []


@pytest.mark.parametrize("cls", [TrainConfig, LadderJobConfig, SweepJobConfig])
def test_help_shows_the_docstring_of_every_documented_field(cls):
    """draccus's reader skips a field whose annotation holds quotes (a Literal's choices), so
    ``--model.attention_backend``, ``--parallel.float8``, ``--checkpoint.on_corrupt`` and
    ``--sweep.horizon_trials`` showed their default alone."""
    rows = help_rows(cls)
    docs = {dest: plain_text(doc) for dest in rows if (doc := field_doc(cls, dest))}
    unbroken = {dest: "".join(row.split()) for dest, row in rows.items()}  # argparse breaks at -
    assert [dest for dest, doc in docs.items() if "".join(doc.split()) not in unbroken[dest]] == []
    prefix = "run." if cls is not TrainConfig else ""
    choices = {
        "model.attention_backend": "{auto,flash,cudnn,efficient,math} The scaled_dot_product_",
        "parallel.float8": "{none,tensorwise,rowwise} torchao float8 training of the blocks'",
        "checkpoint.on_corrupt": "{fallback,fail} A latest checkpoint whose files fail their",
    }
    for dest, shown in choices.items():
        assert rows[prefix + dest].startswith(f"--{prefix}{dest} {shown}")
    if cls is SweepJobConfig:
        assert rows["sweep.horizon_trials"].startswith(
            "--sweep.horizon_trials {auto,decays,runs} How trials cover the horizons: "
        )


def test_parse_command_prints_help_and_returns_none(capsys):
    assert parse_command("``python x.py [--config FILE]``\n\nMore.", TrainConfig, ["-h"]) is None
    assert capsys.readouterr().out.startswith("usage: python x.py [--config FILE]\n")


FLAGS = {"--config": True, "--dry-run": False, "--sizes": True}


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--config", "a.yaml", "--config", "b.yaml"], "--config is given twice: give it once"),
        (["--sizes", "15K", "--sizes=25K"], "--sizes is given twice: give it once"),
        (
            ["--dry-run=false"],
            "--dry-run takes no value: write --dry-run alone, not --dry-run=false",
        ),
        (["--sizes=", "--dry-run"], "--sizes needs a value: write --sizes VALUE or --sizes=VALUE"),
        (["--sizes", "--dry-run"], "--sizes needs a value: write --sizes VALUE or --sizes=VALUE"),
        (["--dry-run", "--sizes"], "--sizes needs a value: write --sizes VALUE or --sizes=VALUE"),
    ],
)
def test_own_flags_refuse_a_repeat_a_switch_value_and_a_missing_value(argv, expected):
    """Once: the last repeat won, ``--dry-run=false`` meant true, ``--sizes=`` took the next
    argument as its value."""
    with pytest.raises(ConfigError) as err:
        split_args(argv, FLAGS)
    assert str(err.value) == expected


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--run.trainer.seed"],
            "--run.trainer.seed needs a value: write --run.trainer.seed=VALUE",
        ),
        (
            ["--run.trainer.seed", "--dry-run"],
            "--run.trainer.seed needs a value: write --run.trainer.seed=VALUE",
        ),
    ],
)
def test_an_override_without_a_value_says_so(argv, expected):
    """Once "unknown argument '--run.trainer.seed': use --config FILE ...", for a key that
    exists."""
    with pytest.raises(ConfigError) as err:
        split_args(argv, FLAGS)
    assert str(err.value) == expected


def test_a_top_level_key_without_a_value_says_so():
    """``--dir`` alone was "unknown argument '--dir'", though ``--dir=runs/x`` works; a name
    that is no key stays unknown."""
    with pytest.raises(ConfigError, match=r"^--dir needs a value: write --dir=VALUE$"):
        parse_command("``python x.py [--config FILE]``", LadderConfig, ["--dir"])
    with pytest.raises(ConfigError, match=r"^unknown argument '--nope'"):
        parse_command("``python x.py [--config FILE]``", LadderConfig, ["--nope"])


def test_an_override_given_twice_takes_its_last_value():
    """A script adds to a base command line; the later value wins, as it is applied later."""
    _, overrides = split_args(["--trainer.seed=3", "--trainer.seed", "4"], FLAGS)
    assert load_config(TrainConfig, None, overrides).trainer.seed == 4


def test_help_lists_own_flags_and_marks_planned_fields():
    """``--sizes`` is the script's comma-separated flag, not the config's list (which the command
    line can't set); a planned field's default is never used."""
    text = help_text(
        "python x.py [--config FILE] [overrides]",
        LadderConfig,
        {"--dry-run": False, "--sizes": True},
        {"--dry-run": "plan and print; train nothing", "--sizes": "a subset, such as 1M,3M"},
        {"run.optim.lr": "lr", "run.schedule": "duration"},
    )
    options = text.split("\nLadderConfig:\n", 1)[0]
    assert options.endswith(
        "  --config FILE         a YAML file of settings; overrides\n"
        "                        (--section.key=value) win over it\n"
        "  --dry-run             plan and print; train nothing\n"
        "  --sizes SIZES         a subset, such as 1M,3M\n"
    )
    assert "--sizes list[str]" not in text
    assert "  --run.optim.lr float  set by the plan from lr, so not settable\n" in text
    assert (
        "  --run.schedule.warmup float\n                        set by the plan from duration"
        in text
    )
    assert "(default: 0.003)" not in text


def test_help_without_descriptions_still_lists_own_flags():
    text = help_text("python x.py", LadderConfig, {"--resume": False, "--sizes": True})
    assert "\n  --resume\n  --sizes SIZES\n" in text and "--sizes list[str]" not in text


def test_entry_points_format_run_warnings_as_one_line_and_leave_others_alone(monkeypatch):
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # restored after
    with pytest.raises(SystemExit):
        exit_on_error(lambda: None)
    exit_on_error_again = warnings.formatwarning
    with pytest.raises(SystemExit):
        exit_on_error(lambda: None)
    assert warnings.formatwarning is exit_on_error_again, "installed once, not wrapped again"
    assert warnings.formatwarning("shards unchecked", RunWarning, "/lib/x.py", 7) == (
        "warning: shards unchecked\n"
    )
    assert warnings.formatwarning("a torch warning", UserWarning, "/lib/x.py", 7, "") == (
        "/lib/x.py:7: UserWarning: a torch warning\n"
    )


@pytest.mark.parametrize(
    "doc, shown",
    [
        ("(use :attr:`run_location`)", "(use run_location)"),
        ("see :func:`~trainer_core.ray.reader.resume_step`", "see resume_step"),
        ("see :meth:`Checkpointer.load_latest`", "see Checkpointer.load_latest"),
        (":py:class:`the trainer <trainer_core.train.trainer.Trainer>`", "the trainer"),
        ("``size`` picks dims; ``{25K: 8}``", "size picks dims; {25K: 8}"),
    ],
)
def test_docstring_markup_reads_as_plain_text(doc, shown):
    assert plain_text(doc) == shown


@pytest.mark.parametrize("cls", [TrainConfig, RayTrainConfig, LadderConfig])
def test_help_shows_no_rest_markup_and_a_described_heading(cls):
    """--help printed "(use :attr:`run_location`)" and "``size`` picks dims", and under
    workflows/train.py a bare "RayTrainConfig:" heading (no docstring of its own)."""
    text = help_text("python x.py", cls)
    assert "`" not in text and not re.search(r":\w+:", text.replace("--", ""))
    assert "\n  size picks dims from the size table;" in text
    heading = text.split(f"\n{cls.__qualname__}:\n", 1)[1]
    assert heading.startswith("  ") and heading.split("\n", 1)[0].strip()
    if cls is not LadderConfig:
        assert heading.startswith("  Everything one training run needs.\n")


def test_a_ctrl_c_an_entry_point_leaves_unhandled_is_one_line_and_exit_130(capsys):
    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as done:
        try:
            exit_on_error(interrupted)
        except KeyboardInterrupt:  # not on to pytest, which would take it for the user's own
            pytest.fail("the KeyboardInterrupt went past exit_on_error")
    assert done.value.code == 130 and capsys.readouterr().err == "interrupted\n"


def test_the_ladders_help_marks_eval_batches_as_planned_from_eval_tokens(run_script):
    """The demo config sets eval_tokens, and then --run.trainer.eval_batches is refused: the
    help listed it with a default as if it could be set."""
    code, out, _ = run_script("workflows/ladder.py", "--help")
    assert code == 0
    (line,) = [line for line in out.splitlines() if "--run.trainer.eval_batches" in line]
    block = out[out.index(line) :].split("\n  --", 1)[0]
    assert "eval_tokens, when set (> 0)" in block


def test_the_sweeps_help_describes_the_sweep_not_the_ladder(run_script):
    """It borrowed the ladder's lines: a dry run that plots the LR schedule (a sweep draws
    none), a resume of "the experiment in dir" (a sweep writes to sweep.dir)."""
    code, out, _ = run_script("workflows/lr_sweep.py", "--help")
    text = " ".join(out.split())
    assert code == 0 and "plot the LR schedule" not in text
    assert "--resume go on with the sweep in sweep.dir" in text
    assert "SweepJobConfig: A ladder's sizes and runs, swept" in text
