from __future__ import annotations

from types import SimpleNamespace

import pytest


def test_a_run_started_after_one_that_never_ended_logs_to_its_own_wandb_run(tiny_config, tmp_path):
    """A reused Tune trial process trains runs one after another; a run stopped early never
    calls ``on_end``. The next run's metrics must go to a W&B run of its own."""
    import wandb

    from trainer_core.train.tracking import WandbCallback

    callbacks = []
    for name in ("stopped", "next"):
        cfg = tiny_config(tmp_path / name, "--tracking.wandb=true")
        callback = WandbCallback(cfg, SimpleNamespace(name=name))
        callback.on_start({})
        callback.on_log(1, {"train/loss": 1.0})
        callbacks.append(callback)
    stopped, following = callbacks
    try:
        assert following.run is not stopped.run and following.run.id != stopped.run.id
        assert following.run.name == "next" and wandb.run is following.run
        with pytest.raises(Exception, match="finished"):
            stopped.run.log({"train/loss": 2.0})
    finally:
        following.on_end({})
