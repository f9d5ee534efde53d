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
    """Each Ray Train worker printed its own ``[startup]`` line, N near-copies per run; the
    one line names its run, as the run's other lines do (trials start side by side)."""
    import time

    from trainer_core.ray.worker import StartupClock

    for rank in (0, 1):
        clock = StartupClock(time.time(), "fit()", rank)
        clock.on_start({"name": "exp-25K", "earlier_starts": []})
        clock.on_step_end(1)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[exp-25K] [startup] after fit(): ")
    assert "trainer built +" in lines[0] and lines[0].endswith("s (first log: step 1)")


def test_a_worker_group_restarted_inside_one_fit_is_timed_from_its_own_process(
    tiny_config, tmp_path, capsys, monkeypatch
):
    """Ray Train restarts a failed worker group inside the driver's one ``fit()``: the new
    group's line counted from that ``fit()``, the failed group's training included. A relaunch
    (a new ``fit()``) is timed from its own."""
    import time

    from stops import crash_after

    from trainer_core.ray import runtime
    from trainer_core.ray.worker import StartupClock
    from trainer_core.train.build import build_trainer

    cfg = tiny_config(tmp_path / "run", "--checkpoint.save_interval_steps=5")
    fit_called = time.time()
    crash_after(build_trainer(cfg, extra_callbacks=[StartupClock(fit_called, "fit()")]), 5)
    time.sleep(0.2)  # the failed group trained for this long after fit()
    monkeypatch.setattr(runtime, "process_ready_at", time.time())  # the new group's setup hook
    restarted = StartupClock(fit_called, "fit()")
    crash_after(build_trainer(cfg, extra_callbacks=[restarted]), 10)
    relaunched = StartupClock(time.time(), "fit()")
    build_trainer(cfg, extra_callbacks=[relaunched]).fit()

    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[run] [startup]")]
    assert len(lines) == 3
    assert lines[0].startswith("[run] [startup] after fit(): train fn +")
    assert lines[1].startswith(
        "[run] [startup] after this restarted worker group's process came up: "
    )
    assert lines[1].endswith("s (first log: step 10)") and "process ready" not in lines[1]
    since_fit = time.time() - fit_called
    assert restarted.t0 == runtime.process_ready_at and restarted.t0 - fit_called >= 0.2
    assert all(0 <= t - restarted.t0 < since_fit - 0.2 for t in restarted.marks.values())
    assert lines[2].startswith("[run] [startup] after fit(): train fn +")
    assert relaunched.t0 > runtime.process_ready_at  # not re-based: its own fit()
