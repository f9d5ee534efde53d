"""A damaged record file (a hand edit, a bad copy) in a run or experiment dir: every reader
refuses it in one line naming the file and what is wrong, and nothing already written changes."""

from __future__ import annotations

import pytest

from trainer_core.config.loader import from_dict
from trainer_core.errors import RunWarning
from trainer_core.io import run_dir
from trainer_core.io.records import RecordError, read_json_record, read_yaml_record
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.plan import plan_ladder
from trainer_core.ladder.record import write_experiment_record

FIX = "restore it from a copy, or use a new dir"

DAMAGED_YAML = {
    b"model: [x\n": ":2: not valid YAML (expected ',' or ']', but got '<stream end>')",
    b"a: 1\nb: [2\nc: 3\n": ":3: not valid YAML (expected ',' or ']', but got ':')",
    b"name: \xff\n": ": not UTF-8 text (byte 6)",
    b"42\n": ": holds a number, not a mapping",
    b"- 1\n": ": holds a list, not a mapping",
    b"": ": is empty",
    b"a: \x00\n": ": not valid YAML (unacceptable character #x0000: special characters are not "
    "allowed)",
}
"""File content -> what the message says after the file's name."""


@pytest.mark.parametrize(("content", "why"), DAMAGED_YAML.items())
def test_a_damaged_yaml_record_is_refused_naming_the_file(tmp_path, content, why):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(RecordError) as err:
        read_yaml_record(path)
    assert str(err.value) == f"{path}{why}; {FIX}"


def test_a_damaged_json_record_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"name": "1M", "num_p')
    with pytest.raises(RecordError) as err:
        read_json_record(path)
    assert str(err.value) == f"{path}:1: not valid JSON (Unterminated string starting at); {FIX}"
    path.write_text("{}")
    with pytest.raises(RecordError) as err:
        read_json_record(path, list)
    assert str(err.value) == f"{path}: holds a mapping, not a list; {FIX}"
    assert read_json_record(path) == {}


def test_a_run_json_cut_short_is_refused_and_kept(tmp_path):
    """It was a JSONDecodeError traceback, from a relaunch or from marking a trial's end."""
    path = tmp_path / "run.json"
    path.write_text('{"name": "1M",\n "status": "runn')
    why = f"{path}:2: not valid JSON (Unterminated string starting at); {FIX}"
    for read in (run_dir.read_run_json, run_dir.worker_groups, run_dir.mark_stopped):
        with pytest.raises(RecordError) as err:
            read(tmp_path)
        assert str(err.value) == why
    assert path.read_text() == '{"name": "1M",\n "status": "runn'


@pytest.mark.parametrize("content", [b"model: [x\n", b"name: \xff\n", b"42\n"])
def test_a_damaged_experiment_yaml_is_refused_by_its_kind(tmp_path, content):
    """ParserError, UnicodeDecodeError and "argument of type 'int' is not iterable" tracebacks."""
    (tmp_path / "experiment.yaml").write_bytes(content)
    with pytest.raises(RecordError) as err:
        run_dir.recorded_experiment_kind(tmp_path)
    assert str(err.value) == f"{tmp_path / 'experiment.yaml'}{DAMAGED_YAML[content]}; {FIX}"


def test_a_bad_byte_in_metrics_spoils_only_its_line(tmp_path):
    """The line is skipped with a warning naming it (every reader's rule); the steps around it
    still count."""
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 5}\n{"step": 10, "x": "\xff"}\n')
    with pytest.warns(RunWarning, match=r"metrics\.jsonl:2: ignoring a line that is not UTF-8"):
        assert run_dir.last_logged_step(tmp_path) == 5
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 5}\n{"step": 1\xff}\n{"step": 15}\n')
    with pytest.warns(RunWarning, match=r"metrics\.jsonl:2: "):
        assert run_dir.last_logged_step(tmp_path) == 15


def ladder(tmp_path) -> LadderConfig:
    return from_dict(LadderConfig, {"sizes": ["15K"], "dir": str(tmp_path)})


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("experiment.yaml", b"42\n", ": holds a number, not a mapping"),
        ("experiment.yaml", b"sizes: [15K\n", ":2: not valid YAML"),
        ("plan.json", b'[{"size": "15K"', ":1: not valid JSON (Expecting ',' delimiter)"),
        ("plan.json", b'{"size": "15K"}', ": holds a mapping, not a list"),
    ],
)
def test_resume_over_a_damaged_record_is_refused_and_writes_nothing(tmp_path, name, content, why):
    job = ladder(tmp_path)
    write_experiment_record(job, plan_ladder(job, None), tmp_path)
    (tmp_path / name).write_bytes(content)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(RecordError) as err:
        write_experiment_record(job, plan_ladder(job, None), tmp_path, resume=True)
    assert str(err.value).startswith(f"{tmp_path / name}{why}")
    assert str(err.value).endswith(f"; {FIX}")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("script", ["workflows/ladder.py", "workflows/lr_sweep.py"])
def test_an_experiment_dir_with_a_damaged_record_stops_a_dry_run_in_one_line(
    tmp_path, run_script, script
):
    bad = b"model: [x\n"
    path = tmp_path / "experiment.yaml"
    path.write_bytes(bad)
    key = "--dir" if script.endswith("ladder.py") else "--sweep.dir"
    code, _, err = run_script(script, "--dry-run", f"{key}={tmp_path}")
    assert (code, err) == (2, f"error: {path}{DAMAGED_YAML[bad]}; {FIX}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["experiment.yaml"]
    assert path.read_bytes() == bad
