from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainer_core.cli import split_args
from trainer_core.config import TrainConfig
from trainer_core.configio import ConfigError, from_dict, load_config, to_dict, to_yaml
from trainer_core.paths import check_output_dir


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


@contextmanager
def unprivileged():
    """Run the block as user 'nobody' when the tests run as root, whom no permission bit stops."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_output_dir_check_names_the_key_and_creates_nothing(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    fix = "choose another trainer.run_dir"
    with pytest.raises(ConfigError) as err:
        check_output_dir(regular / "a" / "run", "trainer.run_dir")
    assert str(err.value) == (
        f"trainer.run_dir: {regular / 'a' / 'run'} can't be created, {regular} is a file; {fix}"
    )
    with pytest.raises(
        ConfigError, match=f"^trainer.run_dir: {regular} is a file, not a directory"
    ):
        check_output_dir(regular, "trainer.run_dir")
    assert check_output_dir(tmp_path / "new" / "run", "k") == tmp_path / "new" / "run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_unwritable_output_dir_is_named():
    base = Path(tempfile.mkdtemp())  # pytest's tmp_path sits in a dir only its owner may enter
    base.chmod(0o755)
    locked = base / "locked"
    locked.mkdir(mode=0o555)
    try:
        with unprivileged(), pytest.raises(ConfigError) as err:
            check_output_dir(locked / "run", "dir")
        assert str(err.value) == (
            f"dir: {locked / 'run'} can't be created, {locked} is not writable; choose another dir"
        )
        with unprivileged(), pytest.raises(ConfigError, match=f"^dir: {locked} is not writable"):
            check_output_dir(locked, "dir")
        assert check_output_dir(base / "fine", "dir") == base / "fine"
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize(
    "script, args, key",
    [
        ("trainer_core/train.py", ["--trainer.run_dir={target}"], "trainer.run_dir"),
        ("workflows/train.py", ["--trainer.run_dir={target}"], "trainer.run_dir"),
        ("workflows/ladder.py", ["--dir={target}"], "dir"),
        ("workflows/lr_sweep.py", ["--dry-run", "--sweep.dir={target}"], "sweep.dir"),
        ("workflows/analyze.py", ["{tmp}", "--out", "{target}"], "--out"),
        (
            "datasets/tokenize_corpus.py",
            ["--input", "{tmp}/none.txt", "--out", "{target}"],
            "--out",
        ),
    ],
)
def test_every_entry_point_checks_its_output_dir_first(run_script, tmp_path, script, args, key):
    regular = tmp_path / "file"
    regular.write_text("x")
    target = regular / "out"
    code, _, err = run_script(script, *(a.format(target=target, tmp=tmp_path) for a in args))
    assert code == 2
    assert (
        err
        == f"error: {key}: {target} can't be created, {regular} is a file; choose another {key}\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_ray_config_checks_the_batch_splits_over_its_data_parallel_ranks(tiny_config, tmp_path):
    from trainer_core.ray.config import RayTrainConfig

    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, "--ray.num_workers=3", cls=RayTrainConfig)
    assert str(e.value) == (
        "trainer.global_batch_size: 512 is not allowed; its 8 sequences can't be split evenly "
        "over 3 data-parallel ranks"
    )
    # 8 workers in TP pairs are 4 data-parallel ranks: 12 sequences are 3 per rank, and a
    # micro-batch of 2 divides the 12 but not the 3.
    args = ("--ray.num_workers=8", "--parallel.tp=2", "--train_module.rank_microbatch_seqs=2")
    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, *args, "--trainer.global_batch_size=768", cls=RayTrainConfig)
    assert str(e.value) == (
        "trainer.global_batch_size: 768 is not allowed; each of the 4 data-parallel ranks gets 3 "
        "sequences, not a multiple of train_module.rank_microbatch_seqs=2"
    )


def test_entry_points_print_config_errors_in_one_line(run_script, tmp_path):
    write(tmp_path / "a.yaml", "optim: !include a.yaml\n")
    code, _, err = run_script("trainer_core/train.py", "--config", str(tmp_path / "a.yaml"))
    assert (code, err) == (
        2,
        f"error: !include cycle: {tmp_path / 'a.yaml'} -> {tmp_path / 'a.yaml'}; remove one of these includes\n",
    )
    code, _, err = run_script("workflows/train.py", "--optim.lr=.inf")
    assert (code, err) == (2, "error: optim.lr: inf is not a finite number\n")


def test_analysis_errors_print_in_one_line_too(run_script, tmp_path):
    code, _, err = run_script("workflows/analyze.py", str(tmp_path / "missing"))
    assert code == 2 and err.startswith(f"error: {tmp_path / 'missing'}") and err.count("\n") == 1
    assert "missing: no such directory" in err
