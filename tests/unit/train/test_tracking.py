from __future__ import annotations

import json
import shutil
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


def test_a_resumed_run_logs_each_step_to_wandb_once_in_order(tiny_config, tmp_path):
    """Killed at step 7 with its last checkpoint at 4, the run replays 5..7: W&B, like
    metrics.jsonl, holds each step once, in order, in one W&B run, with the same losses."""
    from stops import StopAfter
    from wandb_history import history

    from trainer_core.train.build import build_trainer

    run_dir = tmp_path / "run"
    args = ("--tracking.wandb=true", "--trainer.max_steps=12", "--trainer.log_interval=1")
    cfg = tiny_config(run_dir, *args, "--checkpoint.save_interval_steps=4")
    with pytest.raises(KeyboardInterrupt):
        build_trainer(cfg, extra_callbacks=[StopAfter(7)]).fit()
    build_trainer(cfg).fit()

    rows = history(run_dir)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["_step"] for _, _, r in rows] == [r["step"] for r in logged] == list(range(1, 13))
    assert len({segment for segment, _, _ in rows}) == 2 and len({i for _, i, _ in rows}) == 1
    for (_, _, row), record in zip(rows, logged, strict=True):
        assert row["train/loss"] == pytest.approx(record["train/loss"], rel=1e-4), row["_step"]

    first_id = rows[0][1]
    shutil.rmtree(run_dir)  # a new run in the same dir: a W&B run of its own
    build_trainer(tiny_config(run_dir, *args, "--trainer.max_steps=2")).fit()
    assert {i for _, i, _ in history(run_dir)} - {first_id}


def test_a_run_resumed_from_a_moved_copy_continues_its_wandb_run(tiny_config, tmp_path):
    """An experiment copied elsewhere (``--resume`` accepts it) resumes into the same W&B run:
    the id came from the run dir's full path, so the copy opened a second one and logged every
    step again."""
    from stops import StopAfter
    from wandb_history import history

    from trainer_core.train.build import build_trainer

    args = ("--tracking.wandb=true", "--trainer.max_steps=8", "--trainer.log_interval=1")
    first, moved = tmp_path / "a" / "run", tmp_path / "b" / "run"
    cfg = tiny_config(first, *args, "--checkpoint.save_interval_steps=4")
    with pytest.raises(KeyboardInterrupt):
        build_trainer(cfg, extra_callbacks=[StopAfter(5)]).fit()
    shutil.move(first.parent, moved.parent)
    build_trainer(tiny_config(moved, *args, "--checkpoint.save_interval_steps=4")).fit()

    rows = history(moved)
    assert len({i for _, i, _ in rows}) == 1
    assert [r["_step"] for _, _, r in rows] == list(range(1, 9))


def test_tracking_without_wandb_or_with_a_wandb_file_stops_before_the_run(
    tiny_config, tmp_path, monkeypatch
):
    import importlib.util

    from trainer_core.config.decode import ConfigError
    from trainer_core.train.build import build_trainer

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb").write_text("not a dir")
    with pytest.raises(ConfigError, match=r"^tracking.wandb: .*/run/wandb is a file where W&B"):
        build_trainer(tiny_config(run_dir, "--tracking.wandb=true"))
    assert not (run_dir / "run.json").exists()
    (run_dir / "wandb").unlink()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "wandb" else find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match=r"^tracking.wandb: true needs the wandb package"):
        build_trainer(tiny_config(run_dir, "--tracking.wandb=true"))
    assert not (run_dir / "run.json").exists()


def test_rows_a_killed_runs_wandb_service_never_wrote_are_logged_again(tiny_config, tmp_path):
    """Killed at step 7, its W&B file holding the rows up to 3 only (written in blocks, seconds
    apart): the run resumed from its checkpoint at 4 logs 5..12, where before it skipped to 8,
    as if everything handed to W&B had been written."""
    import wandb
    from stops import StopAfter
    from wandb_history import cut_after, history

    from trainer_core.train.build import build_trainer

    run_dir = tmp_path / "run"
    args = ("--tracking.wandb=true", "--trainer.max_steps=12", "--trainer.log_interval=1")
    cfg = tiny_config(run_dir, *args, "--checkpoint.save_interval_steps=4")
    with pytest.raises(KeyboardInterrupt):
        build_trainer(cfg, extra_callbacks=[StopAfter(7)]).fit()
    wandb.run.finish()  # what the killed process's files would hold, then cut
    wandb.teardown()  # (finish returns before W&B's service has written them)
    cut_after(run_dir, 3)
    build_trainer(cfg).fit()
    steps = [row["_step"] for _, _, row in history(run_dir)]
    assert steps == [1, 2, 3, *range(5, 13)]
