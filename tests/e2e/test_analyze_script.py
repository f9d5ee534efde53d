"""Analysis on synthetic experiment dirs written to disk from known scaling-law constants."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_experiments import TASK, is_png, make_ladder


@pytest.mark.slow
def test_analyze_script_on_ladder_from_a_shell_and_on_a_sweep(
    processes, run_script, ladder_dir: Path, sweep_dir: Path, tmp_path: Path
):
    out = tmp_path / "ladder_plots"
    proc = processes.python(
        "workflows/analyze.py",
        str(ladder_dir),
        "--out",
        str(out),
        "--target-params",
        "1e9",
        "--target-flops",
        "1e21",
        "--bootstrap",
        "5",
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "L(N, D) = E + A / N^alpha + B / D^beta" in text
    assert "held out: s6" in text and "compute-optimal at C = 1e+21 FLOPs" in text
    assert "frontier L(C) = E + A * C^-alpha" in text
    assert text.count("prediction:") == 1
    assert is_png(out / "loss_vs_compute.png") and is_png(out / "loss_curves.png")

    code, stdout, stderr = run_script(
        "workflows/analyze.py", str(sweep_dir), "--out", str(tmp_path / "sweep_plots")
    )
    assert code == 0, stderr
    assert "LR sweep" in stdout and "lr*(N) =" in stdout and "quadratic" in stdout
    assert is_png(tmp_path / "sweep_plots" / "lr_vs_size.png")


def test_analyze_script_fits_the_task_accuracy_it_is_told_to(run_script, tmp_path: Path):
    """``--task-accuracy`` reaches step 2 (the held-out row names the accuracy fitted), and a
    name that is not an accuracy is refused by the parser with the choices, before any work."""
    ladder = make_ladder(tmp_path / "exp", task=True)
    args = [str(ladder), "--out", str(tmp_path / "plots"), "--bootstrap", "5"]
    code, stdout, stderr = run_script("workflows/analyze.py", *args, "--task-accuracy", "acc_norm")
    assert code == 0, stderr
    row = next(line for line in stdout.splitlines() if line.startswith(TASK + " "))
    assert row.split()[1] == "acc_norm"
    code, stdout, stderr = run_script("workflows/analyze.py", *args, "--task-accuracy", "acc_raw")
    assert code == 2 and stdout == ""
    assert "--task-accuracy: invalid choice: 'acc_raw'" in stderr and "'acc_pmi'" in stderr


@pytest.mark.parametrize(
    "flag, value, why",
    [
        ("--target-flops", "-5", "must be > 0, got -5"),
        ("--target-flops", "0", "must be > 0, got 0"),
        ("--target-params", "inf", "must be a finite number, got 'inf'"),
        ("--bootstrap", "-1", "must be >= 0, got -1"),
        ("--mfu", "0", "must be in (0, 1], got 0"),
    ],
)
def test_analyze_script_refuses_a_bad_number_naming_the_flag_before_any_fit(
    run_script, tmp_path: Path, flag, value, why
):
    """A negative target once reached a power law as a complex number and a negative bootstrap
    count reached NumPy, each a trace after the fits; now argparse names the flag, and no plot
    is written."""
    out = tmp_path / "plots"
    code, stdout, stderr = run_script(
        "workflows/analyze.py", str(tmp_path / "no-such-exp"), "--out", str(out), flag, value
    )
    assert (code, stdout) == (2, "")
    assert f"error: argument {flag}: {why}\n" in stderr
    assert not out.exists()


def test_analyze_script_checks_the_device_before_fitting(run_script, ladder_dir, tmp_path):
    code, stdout, stderr = run_script(
        "workflows/analyze.py", str(ladder_dir), "--out", str(tmp_path / "p"), "--device", "Z80"
    )
    assert (code, stdout) == (2, "")
    assert stderr.startswith("error: device 'Z80': no peak FLOP/s known; use cpu or one of H100")


def test_analyze_script_checks_the_hparam_sweep_dir_before_fitting(
    run_script, ladder_dir, sweep_dir, tmp_path
):
    """A missing dir or a ladder given as --hparam-sweep stops in one line (the report ran and
    exited 0 with a table saying no sweep was given), and a sweep dir is taken."""
    from trainer_core.analysis import TargetSettings

    ladder = tmp_path / "ladder"
    ladder.mkdir()
    (ladder / "experiment.yaml").write_text("name: demo\nsizes: [15K]\n")
    for bad, why in [
        (tmp_path / "nope", "holds no experiment.yaml"),
        (ladder, "is a ladder, not an LR sweep"),
    ]:
        args = (str(ladder_dir), "--out", str(tmp_path / "p"), "--hparam-sweep", str(bad))
        code, stdout, stderr = run_script("workflows/analyze.py", *args)
        assert (code, stdout) == (2, "")
        assert stderr.startswith(f"error: --hparam-sweep: {bad} {why}")
    assert TargetSettings(hparam_sweep=str(sweep_dir)).resolve(ladder_dir)[1].lr == str(sweep_dir)
