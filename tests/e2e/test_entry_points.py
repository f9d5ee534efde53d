from __future__ import annotations

import json
import re
import signal
import sys
import warnings
from pathlib import Path

import pytest

from trainer_core.io.run_dir import last_logged_step
from trainer_core.train.callbacks import BaseCallback


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
    raised it, once (the run's checkpoints are listed once, even where every warning is shown);
    the run resumes from the checkpoint before and saves the step again, whole."""
    run_dir = tmp_path / "run"
    args = tiny_args(
        run_dir,
        "--trainer.max_steps=4",
        "--trainer.log_interval=1",
        "--checkpoint.save_interval_steps=2",
        "--checkpoint.keep=[{every: 2}]",
    )
    first = processes.python("-m", "trainer_core.train", *args)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = run_dir / "checkpoints" / "step-00000004"
    (checkpoint / "info.json").unlink()
    again = processes.python("-m", "trainer_core.train", *args, env={"PYTHONWARNINGS": "always"})
    assert again.returncode == 0, again.stderr[-3000:]
    said = [line for line in again.stderr.splitlines() if "skipping" in line]
    assert said == [f"warning: skipping incomplete checkpoint {checkpoint} (info.json is missing)"]
    assert "UserWarning: skipping" not in again.stderr and "warnings.warn" not in again.stderr
    assert (checkpoint / "info.json").is_file()
    steps = [json.loads(line).get("step") for line in (run_dir / "metrics.jsonl").open()]
    assert steps == [1, 2, 3, 4], "resumed at step 2: its log replayed from there"


def two_ranks(*args: str) -> list:
    """The README's ``torchrun`` command: two ranks of ``python -m trainer_core.train``."""
    torchrun = Path(sys.executable).with_name("torchrun")
    return [torchrun, "--standalone", "--nproc-per-node=2", "-m", "trainer_core.train", *args]


@pytest.mark.slow
def test_torchrun_runs_two_ranks_that_train_together_and_both_exit_0(
    processes, tiny_args, tmp_path
):
    """The README's ``torchrun`` line: two gloo ranks train one run (one metrics log, both
    ranks in its run info) and each rank's process exits 0 (see ``exit_rank``)."""
    run_dir = tmp_path / "run"
    args = tiny_args(run_dir, "--trainer.device=cpu", "--trainer.max_steps=10")
    done = processes.run(*two_ranks(*args), env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "train/loss" in r]
    assert steps == [5, 10]
    assert records[-1]["eval/loss"] < records[0]["train/loss"]
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["status"], run["last_step"], len(run["workers"][0]["ranks"])) == ("finished", 10, 2)


def last_line(text: str) -> str:
    return text.rstrip("\n").rsplit("\n", 1)[-1]


@pytest.mark.slow
def test_ctrl_c_ends_a_run_in_one_line_saying_that_the_same_command_resumes(
    processes, tiny_args, tmp_path
):
    """Ctrl+C printed a 30-line KeyboardInterrupt traceback (ending inside pyarrow) and left
    run.json "running", with no word that re-running resumes. Now: one line, exit 130, the run
    recorded as interrupted, and the same command goes on from that checkpoint."""
    run_dir = tmp_path / "run"
    args = tiny_args(
        run_dir,
        "--trainer.max_steps=1000",
        "--trainer.log_interval=1",
        "--checkpoint.save_interval_steps=3",
    )
    said = re.compile(
        r"interrupted at step (\d+); the latest checkpoint is step (\d+): re-run the same "
        r"command to resume"
    )

    def ctrl_c(name: str, ready) -> int:
        """Start the run, Ctrl+C it once ``ready()``; the checkpoint it says re-running resumes."""
        log = tmp_path / f"{name}.log"
        proc = processes.start(sys.executable, "-m", "trainer_core.train", *args, log=log)
        processes.wait_until(ready, proc, log, 240)
        processes.kill(proc, signal.SIGINT)
        out = log.read_text()
        assert proc.returncode == 130 and "Traceback" not in out, out[-3000:]
        match = said.fullmatch(last_line(out))
        assert match, out[-3000:]
        step, checkpoint = int(match[1]), int(match[2])
        assert 0 < checkpoint <= step and checkpoint % 3 == 0
        assert (run_dir / "checkpoints" / f"step-{checkpoint:08d}" / "info.json").is_file()
        run = json.loads((run_dir / "run.json").read_text())
        assert (run["status"], run["last_step"]) == ("interrupted", step)
        return checkpoint

    def groups() -> list[dict]:
        record = run_dir / "run.json"
        return json.loads(record.read_text())["workers"] if record.is_file() else []

    def saved() -> bool:
        found = (run_dir / "checkpoints").glob("step-*")
        return any(re.fullmatch(r"step-\d{8}", p.name) for p in found)  # committed, not scratch

    checkpoint = ctrl_c("first", saved)
    assert ctrl_c("again", lambda: len(groups()) == 2) >= checkpoint
    assert groups()[1]["start_step"] == checkpoint, "the same command resumed where it stopped"


@pytest.mark.slow
def test_ctrl_c_on_torchrun_ends_every_rank_with_one_line(processes, tiny_args, tmp_path):
    """torchrun passes the SIGINT to each rank, and none waits for the others: a rank in a
    collective (a checkpoint's, here at every step) when its peer left got that collective's
    error, a traceback, instead of its own interrupt, and rank 0 left run.json "running"."""
    run_dir = tmp_path / "run"
    args = tiny_args(
        run_dir,
        "--trainer.device=cpu",
        "--trainer.max_steps=1000",
        "--trainer.log_interval=1",
        "--checkpoint.save_interval_steps=1",
    )
    log = tmp_path / "torchrun.log"
    proc = processes.start(
        *two_ranks(*args),
        log=log,
        env={"OMP_NUM_THREADS": "1"},
    )
    # past step 2: checkpoints are temporary and replaced each step, so no one dir is waited for
    processes.wait_until(lambda: last_logged_step(run_dir) >= 2, proc, log, 240)
    processes.kill(proc, signal.SIGINT)  # torchrun's own ranks are in sessions of their own
    out = log.read_text()
    lines = [line for line in out.splitlines() if line.startswith("interrupted at step ")]
    assert len(lines) == 1 and "re-run the same command to resume" in lines[0], out[-3000:]
    assert "[rank" not in out, out[-3000:]  # no rank's traceback
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "interrupted", run


class CtrlCInSave(BaseCallback):
    """A Ctrl+C landing in a checkpoint's write, at the end of step 5 (the tiny run's first
    log): DCP catches it with every other error of the write and raises them together as a
    CheckpointException. ``in_zip``: it lands inside ``torch.save``'s zip writer, whose
    ``__exit__`` then raises its own error with the interrupt as its context (a CI run: exit 1
    and DCP's traceback)."""

    def __init__(self, scratch, in_zip: bool):
        self.scratch, self.in_zip = scratch, in_zip

    def on_step_end(self, step: int) -> None:
        if step == 5:
            import torch
            import torch.distributed.checkpoint as dcp

            from trainer_core.compat import dcp_call

            in_zip = self.in_zip

            class Interrupted(dcp.FileSystemWriter):
                def write_data(self, plan, planner):
                    try:
                        raise KeyboardInterrupt
                    finally:
                        if in_zip:
                            raise RuntimeError("[enforce fail] unexpected pos 704 vs 598")

            state = {"x": torch.zeros(2)}
            dcp_call(dcp.save, state, storage_writer=Interrupted(self.scratch))


class CtrlCAtStart(BaseCallback):
    """A Ctrl+C while the run starts: after run.json says "running", before the first step
    (a CI run: the callbacks' start, where the record stayed "running")."""

    def on_start(self, info) -> None:
        raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["step", "in_write", "in_zip", "at_start"])
def test_an_interrupted_run_records_it_and_says_what_re_running_does(
    tiny_config, tmp_path, capsys, where
):
    """A Ctrl+C mid-save came out as DCP's CheckpointException (a BaseException), past every
    handler; one at the start left run.json "running"; a run without checkpoints says that
    re-running starts over."""
    from stops import StopAfter

    from trainer_core.train.__main__ import fit
    from trainer_core.train.build import build_trainer

    run_dir = tmp_path / "run"
    expected = "no checkpoint yet: re-running starts over"
    if where in ("in_write", "in_zip"):
        stop, step = CtrlCInSave(tmp_path / "scratch", in_zip=where == "in_zip"), 5
        cfg = tiny_config(run_dir, "--checkpoint.enabled=false")
        expected = "checkpoints are off (checkpoint.enabled=false): re-running starts over"
    else:
        stop, step = (StopAfter(5), 5) if where == "step" else (CtrlCAtStart(), 0)
        cfg = tiny_config(run_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming ... a single process"
        try:
            assert fit(build_trainer(cfg, extra_callbacks=[stop])) == 130
        except KeyboardInterrupt:  # not on to pytest, which would take it for the user's own
            pytest.fail("the KeyboardInterrupt went past fit")
    assert capsys.readouterr().err == f"interrupted at step {step}; {expected}\n"
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["status"], run["last_step"]) == ("interrupted", step)
