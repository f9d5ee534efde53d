"""A ladder's or LR sweep's task files are read before Ray starts a run: a bad one used to be
found by every run after all had launched ("2 of 2 runs failed: ... 'gold' is 3")."""

from __future__ import annotations

import json

import pytest

SCRIPTS = ("workflows/ladder.py", "workflows/lr_sweep.py")


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """A check that lets a launch through fails the test here instead of starting Ray."""

    def launch(*args, **kwargs):
        raise AssertionError("launched: the task file was not checked first")

    monkeypatch.setattr("trainer_core.ray.ladder_run.run_ladder", launch)
    monkeypatch.setattr("trainer_core.ray.sweep_run.run_sweep", launch)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bad_task_file_stops_the_dry_run_and_the_launch_in_one_line(
    run_script, tiny_experiment, tmp_path, script
):
    task = tmp_path / "qa.jsonl"
    task.write_text(json.dumps({"context": "2 + 2 =", "choices": [" 4", " 5", " 6"], "gold": 3}))
    config = tiny_experiment("exp", run={"evals": {"tasks": [str(task)]}})
    line = f"error: {task}:1: 'gold' is 3, outside 0..2 (the choices' indices)\n"
    for dry_run in (["--dry-run"], []):
        code, _, err = run_script(script, "--config", str(config), *dry_run)
        assert (code, err) == (2, line)
    assert not (tmp_path / "exp").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_task_file_missing_here_is_a_dry_run_warning_and_stops_a_launch(
    run_script, tiny_experiment, tmp_path, script
):
    """As the data's: a dry run plans from the config (the file may be on the cluster)."""
    task = tmp_path / "cluster" / "qa.jsonl"
    config = tiny_experiment("exp", run={"evals": {"tasks": [str(task)]}})
    said = f"task {str(task)!r}: no such file; name a JSONL file or one of demo_next_line"
    code, out, err = run_script(script, "--config", str(config), "--dry-run")
    assert code == 0, err
    assert f"warning: {said} (planned from the config; a launch stops here)\n" in out
    code, _, err = run_script(script, "--config", str(config))
    assert (code, err) == (2, f"error: {said}\n")
