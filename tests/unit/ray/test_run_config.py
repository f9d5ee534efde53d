from __future__ import annotations

import pytest

from trainer_core.config.loader import ConfigError


def test_a_ray_config_checks_the_batch_splits_over_its_data_parallel_ranks(tiny_config, tmp_path):
    from trainer_core.ray.run_config import RayTrainConfig

    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, "--ray.num_workers=3", cls=RayTrainConfig)
    assert str(e.value) == (
        "trainer.global_batch_size: 512 is not allowed; its 8 sequences can't be split evenly "
        "over 3 data-parallel ranks"
    )
    # 8 workers in TP pairs are 4 data-parallel ranks: 12 sequences are 3 per rank, and a
    # micro-batch of 2 divides the 12 but not the 3.
    args = ("--ray.num_workers=8", "--parallel.tp=2", "--train_module.rank_microbatch_seqs=2")
    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, *args, "--trainer.global_batch_size=768", cls=RayTrainConfig)
    assert str(e.value) == (
        "trainer.global_batch_size: 768 is not allowed; each of the 4 data-parallel ranks gets 3 "
        "sequences, not a multiple of train_module.rank_microbatch_seqs=2"
    )


def test_a_ray_config_checks_tensor_parallel_fits_the_model(tiny_config, tmp_path):
    """Checked with the config: in the workers it came 35 s into a Ray run, followed by advice to
    re-run the same command to resume a run that had written nothing."""
    from trainer_core.ray.run_config import RayTrainConfig

    args = ("--ray.num_workers=2", "--parallel.tp=2", "--model.n_kv_heads=1")
    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, *args, cls=RayTrainConfig)
    assert str(e.value) == "parallel.tp: 2 does not divide model.n_kv_heads=1; pick a tp that does"


def test_an_unknown_reader_is_named_with_the_choices(tiny_config, tmp_path):
    from trainer_core.ray.run_config import RayTrainConfig

    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, "--ray.reader=disk", cls=RayTrainConfig)
    assert str(e.value) == "ray.reader: 'disk' is not allowed; must be one of ray_data, worker"
    assert tiny_config(tmp_path, "--ray.reader=worker", cls=RayTrainConfig).ray.reader == "worker"


def test_the_runner_is_checked_against_the_run_width(tiny_config, tmp_path):
    from trainer_core.ray.run_config import RayTrainConfig

    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, "--ray.runner=fork", cls=RayTrainConfig)
    assert str(e.value) == "ray.runner: 'fork' is not allowed; must be one of auto, train, trial"
    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, "--ray.runner=trial", "--ray.num_workers=2", cls=RayTrainConfig)
    assert str(e.value) == (
        "ray.runner: 'trial' is not allowed; 'trial' trains a run's one worker in its Tune "
        "trial's process, and this run has 2 workers: use 'train' (or 'auto')"
    )


@pytest.mark.parametrize(
    ("runner", "workers", "sweep", "decided"),
    [
        ("auto", 1, True, "trial"),
        ("auto", 2, True, "train"),
        ("auto", 1, False, "train"),
        ("train", 1, True, "train"),
        ("trial", 1, False, "trial"),
    ],
)
def test_auto_trains_a_sweeps_one_device_trials_in_their_trial(runner, workers, sweep, decided):
    from trainer_core.ray.run_config import RayConfig

    rc = RayConfig(runner=runner, num_workers=workers)
    assert rc.for_trials(sweep).runner == decided
    assert rc.for_trials(sweep).num_workers == workers


def test_a_ladder_refuses_the_trial_runner_for_a_size_on_several_devices(repo_root):
    from trainer_core.config.loader import load_config
    from trainer_core.ladder.plan import plan_ladder
    from trainer_core.ray.ladder_run import LadderJobConfig, on_ray

    config = repo_root / "workflows" / "configs" / "ladder-gpu.yaml"
    job = load_config(LadderJobConfig, config, ["--ray.runner=trial"])
    wide = [p for p in plan_ladder(job, None) if p.devices > 1][0]
    with pytest.raises(ConfigError) as e:
        on_ray(wide.config, wide, job, sweep=True)
    assert str(e.value) == (
        f"ray.runner: 'trial' trains a run's one worker in its Tune trial's process, and size "
        f"{wide.size} is planned on {wide.devices} devices (max_devices {job.max_devices}): use "
        "'train' (or 'auto')"
    )
    auto = load_config(LadderJobConfig, config, [])
    assert on_ray(wide.config, wide, auto, sweep=True).ray.runner == "train"


def test_a_single_run_on_ray_refuses_the_trial_runner(tiny_config, tmp_path):
    from trainer_core.ray.run_config import RayTrainConfig
    from trainer_core.ray.train_driver import run_training

    cfg = tiny_config(tmp_path / "run", "--ray.runner=trial", cls=RayTrainConfig)
    with pytest.raises(ConfigError, match=r"^ray.runner: 'trial' trains a run inside a ladder"):
        run_training(cfg)
    assert not (tmp_path / "run").exists()


def test_trials_at_once_is_checked_and_handed_to_tune(repo_root, tmp_path):
    """``ray.max_concurrent_trials`` must be >= 0, and a ladder gives it to Tune's settings
    (tests/e2e/test_trial_runner.py shows Tune keeping to it)."""
    from trainer_core.config.loader import load_config
    from trainer_core.ray import ladder_run

    demo = repo_root / "workflows" / "configs" / "ladder-demo.yaml"
    with pytest.raises(ConfigError, match="ray.max_concurrent_trials: -1 .*must be >= 0"):
        load_config(ladder_run.LadderJobConfig, demo, ["--ray.max_concurrent_trials=-1"])
    job = load_config(
        ladder_run.LadderJobConfig, demo, [f"--dir={tmp_path}", "--ray.max_concurrent_trials=8"]
    )
    assert ladder_run.tune_settings(job).max_concurrent == 8
