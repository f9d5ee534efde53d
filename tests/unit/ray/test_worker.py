"""What the processes around a Ray Train worker import when they unpickle its train function."""

from __future__ import annotations

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
