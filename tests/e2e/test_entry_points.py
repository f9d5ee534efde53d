from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "script, args, key",
    [
        ("trainer_core/train/__main__.py", ["--trainer.run_dir={target}"], "trainer.run_dir"),
        ("workflows/train.py", ["--trainer.run_dir={target}"], "trainer.run_dir"),
        ("workflows/ladder.py", ["--dir={target}"], "dir"),
        ("workflows/lr_sweep.py", ["--sweep.dir={target}"], "sweep.dir"),
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


def test_entry_points_print_config_errors_in_one_line(run_script, tmp_path):
    (tmp_path / "a.yaml").write_text("optim: !include a.yaml\n")
    code, _, err = run_script(
        "trainer_core/train/__main__.py", "--config", str(tmp_path / "a.yaml")
    )
    assert (code, err) == (
        2,
        f"error: !include cycle: {tmp_path / 'a.yaml'} -> {tmp_path / 'a.yaml'}; remove one of these includes\n",
    )
    code, _, err = run_script("workflows/train.py", "--optim.lr=.inf")
    assert (code, err) == (2, "error: optim.lr: inf is not a finite number\n")
    # the shipped Ray config, or a ladder run's config.yaml, given to the plain loop
    tiny = "workflows/configs/train-tiny.yaml"
    code, _, err = run_script("trainer_core/train/__main__.py", "--config", tiny)
    assert (code, err) == (
        2,
        "error: ray: this entry point trains without Ray; the ray section is read by "
        "workflows/train.py: run that, or delete the section from the file\n",
    )


def test_analysis_errors_print_in_one_line_too(run_script, tmp_path):
    code, _, err = run_script("workflows/analyze.py", str(tmp_path / "missing"))
    assert code == 2 and err.startswith(f"error: {tmp_path / 'missing'}") and err.count("\n") == 1
    assert "missing: no such directory" in err


@pytest.mark.slow
def test_a_skipped_checkpoint_is_one_warning_line_not_a_python_warning(
    processes, tiny_args, tmp_path
):
    """A user reads "warning: ..." and the run's own lines, not the library's source line that
    raised it; the run then trains from the start and saves that step again, whole."""
    run_dir = tmp_path / "run"
    args = tiny_args(
        run_dir,
        "--trainer.max_steps=2",
        "--trainer.log_interval=1",
        "--checkpoint.save_interval_steps=2",
    )
    first = processes.python("-m", "trainer_core.train", *args)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = run_dir / "checkpoints" / "step-00000002"
    (checkpoint / "info.json").unlink()
    again = processes.python("-m", "trainer_core.train", *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.splitlines()[0] == (
        f"warning: skipping incomplete checkpoint {checkpoint} (info.json is missing)"
    )
    assert "UserWarning" not in again.stderr and "warnings.warn" not in again.stderr
    assert (checkpoint / "info.json").is_file()
    steps = [json.loads(line).get("step") for line in (run_dir / "metrics.jsonl").open()]
    assert steps == [1, 2], "the log restarted with the training"


@pytest.mark.slow
def test_torchrun_runs_two_ranks_that_train_together_and_both_exit_0(
    processes, tiny_args, tmp_path
):
    """The README's ``torchrun`` line: two gloo ranks train one run (one metrics log, both
    ranks in its run info) and each rank's process exits 0 (see ``exit_rank``)."""
    run_dir = tmp_path / "run"
    args = tiny_args(run_dir, "--trainer.device=cpu", "--trainer.max_steps=10")
    torchrun = Path(sys.executable).with_name("torchrun")
    done = processes.run(
        torchrun,
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "trainer_core.train",
        *args,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "train/loss" in r]
    assert steps == [5, 10]
    assert records[-1]["eval/loss"] < records[0]["train/loss"]
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["status"], run["last_step"], len(run["workers"][0]["ranks"])) == ("finished", 10, 2)
