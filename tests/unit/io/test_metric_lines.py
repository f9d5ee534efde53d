"""One rule for a line of ``metrics.jsonl`` that is not a JSON object: every reader skips it with
a warning naming file:line, a resume keeps it, and only the analysis refuses an edited one."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from stops import crash_after
from synthetic_experiments import write_run

from trainer_core.analysis import AnalysisError, load
from trainer_core.errors import RunWarning
from trainer_core.io.run_dir import last_logged_step
from trainer_core.ray.train_driver import run_summary
from trainer_core.train.build import build_trainer
from trainer_core.train.callbacks import JsonlMetrics

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

NOT_UTF8 = b'{"step": 5, "train/lo\xffss": 3.0}'
NOTE = b"restarted by hand here"


def warned(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RunWarning)]


def test_a_resume_keeps_lines_it_cannot_read_and_drops_only_later_steps(tmp_path: Path):
    """The old resume crashed on the byte (UnicodeDecodeError) or on ``7`` (AttributeError) and
    deleted the note."""
    path = tmp_path / "metrics.jsonl"
    kept = [NOT_UTF8, b'{"step": 10}', NOTE, b"7", b'{"no step": 1}']
    path.write_bytes(b"\n".join([*kept, b'{"step": 15}', b'{"step": 20, "train/lo']))
    metrics = JsonlMetrics(tmp_path)
    with pytest.warns(RunWarning) as caught:
        metrics.on_start({"start_step": 10})
    assert warned(caught) == [
        f"{path}:1: ignoring a line that is not UTF-8 text",
        f"{path}:3: ignoring a line that is not valid JSON (Expecting value)",
        f"{path}:4: ignoring a line that is not a JSON object",
    ]  # the cut last line is the kill's own and is dropped without a word (other readers warn)
    assert path.read_bytes() == b"".join(line + b"\n" for line in kept)
    metrics.on_log(15, {"train/loss": 2.0})
    assert json.loads(path.read_bytes().splitlines()[-1])["step"] == 15


def test_readers_of_a_run_skip_what_they_cannot_read(tmp_path: Path):
    """run_summary crashed on the byte; last_logged_step skipped lines without a word."""
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join([b'{"step": 3, "lr": 1.0}', NOTE, b"[]"]))
    with pytest.warns(RunWarning) as caught:
        assert last_logged_step(tmp_path) == 3
    assert len(warned(caught)) == 2
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 4, "lr": 0.5}\n' + NOT_UTF8 + b"\n")
    with pytest.warns(RunWarning, match=r"metrics\.jsonl:2: ignoring a line that is not UTF-8"):
        assert run_summary(tmp_path) == {"step": 4, "lr": 0.5}


def test_the_analysis_skips_damage_but_refuses_an_edited_line(tmp_path: Path):
    run = tmp_path / "runs" / "r"
    write_run(run, size="s", n=1000, lr=1e-3, total_steps=10)
    path = run / "metrics.jsonl"
    path.write_bytes(b"\n".join([NOT_UTF8, b'{"step": 6}', b'{"step": 7, "tr']))
    with pytest.warns(RunWarning) as caught:
        assert list(load(tmp_path).metrics["step"]) == [6]
    assert warned(caught) == [
        f"{path}:1: ignoring a line that is not UTF-8 text",
        f"{path}:3: ignoring a line cut mid-write",
    ]
    path.write_bytes(b'{"step": 6}\n7\n{"step": 8}\n')
    with pytest.raises(AnalysisError, match=r"metrics\.jsonl:2: not a JSON object; fix or delete"):
        load(tmp_path)


@pytest.mark.slow
def test_a_run_resumes_over_damaged_metrics_and_keeps_them(tmp_path: Path, tiny_config):
    """The report's case: a byte that is not UTF-8 in the first line stopped the resume with a
    UnicodeDecodeError traceback; the note below it was deleted."""
    run = tmp_path / "run"
    cfg = tiny_config(run, "--trainer.max_steps=10", "--checkpoint.save_interval_steps=5")
    crash_after(build_trainer(cfg), 5)
    path = run / "metrics.jsonl"
    first, *rest = path.read_bytes().splitlines()
    damaged = first.replace(b'"train/loss"', b'"train/lo\xffss"', 1)
    path.write_bytes(b"\n".join([damaged, NOTE, *rest]) + b"\n")
    with pytest.warns(RunWarning) as caught:
        assert build_trainer(cfg).fit()["steps"] == 10
    assert warned(caught) == [
        f"{path}:1: ignoring a line that is not UTF-8 text",
        f"{path}:2: ignoring a line that is not valid JSON (Expecting value)",
    ]
    lines = path.read_bytes().splitlines()
    assert lines[: 2 + len(rest)] == [damaged, NOTE, *rest]
    assert json.loads(lines[-1])["step"] == 10
