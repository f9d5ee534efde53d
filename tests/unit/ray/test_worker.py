"""What the processes around a Ray Train worker import when they unpickle its train function;
what a worker prints."""

from __future__ import annotations

import math
import pickle


def test_the_controller_and_trial_driver_leave_the_training_stack_unimported(processes):
    """Ray Train's controller unpickles ``train_worker`` and Tune's trial process unpickles
    ``trial_driver``, each in a fresh process per trial, by reference: neither should pay for
    the trainer's checkpointer (torch.distributed.checkpoint, ~1.2 s a process here). The
    worker imports it when the function runs."""
    from trainer_core.ray.tune_run import trial_driver
    from trainer_core.ray.worker import train_worker

    payload = pickle.dumps((train_worker, trial_driver)).hex()
    code = (
        "import pickle, sys\n"
        f"pickle.loads(bytes.fromhex({payload!r}))\n"
        "import trainer_core.ray.train_driver\n"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('torch.distributed.checkpoint', 'trainer_core.train.trainer', 'trainer_core.model'))))\n"
    )
    out = processes.python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_diverged_runs_line_names_the_run(tiny_config, tmp_path):
    """Trials print side by side, each line prefixed by its run: so is the divergence's."""
    from trainer_core.ray.run_config import RayTrainConfig
    from trainer_core.ray.worker import divergence_line
    from trainer_core.train.trainer import NonFiniteLossError

    cfg = tiny_config(tmp_path / "25K", cls=RayTrainConfig)
    error = NonFiniteLossError(step=5, loss=5.5, grad_norm=math.inf)
    assert divergence_line(cfg, 1, error) == f"[25K] rank 1: {error}"
    assert str(error).startswith("non-finite gradient norm at step 5 (")


def test_rank_zero_alone_prints_the_startup_line(capsys):
    """Each Ray Train worker printed its own ``[startup]`` line, N near-copies per run."""
    import time

    from trainer_core.ray.worker import StartupClock

    for rank in (0, 1):
        clock = StartupClock(time.time(), "fit()", rank)
        clock.on_start({})
        clock.on_step_end(1)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[startup] after fit(): ")
    assert "trainer built +" in lines[0] and lines[0].endswith("s (first log: step 1)")
