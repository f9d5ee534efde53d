"""A ladder taking its LR or batch from a sweep is warned of each setting it changed from the
sweep's, since the optimum belongs to them (a cosine ladder planned from a WSD-S sweep at a
32x smaller batch said nothing)."""

from __future__ import annotations

import yaml

from trainer_core.config.loader import from_dict, to_dict
from trainer_core.ladder.sweep_match import sweep_mismatches
from trainer_core.ray.ladder_run import LadderJobConfig

BASE = {"sizes": ["15K"], "duration": {"schedule": "wsds"}, "batch": {"coef": 2048.0}}


def sweep_dir(tmp_path, sweep=None, **changes):
    """A sweep's experiment.yaml: the base ladder's settings with ``changes``."""
    job = from_dict(LadderJobConfig, {**BASE, **changes, "dir": str(tmp_path / "sweep")})
    record = {**to_dict(job), "sweep": sweep or {"batch_factors": [1.0]}}
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "experiment.yaml").write_text(yaml.safe_dump(record))
    return str(tmp_path / "sweep")


def ladder(tmp_path, **changes):
    return from_dict(LadderJobConfig, {**BASE, **changes, "dir": str(tmp_path / "ladder")})


def test_a_ladder_with_the_sweeps_settings_gets_no_warning(tmp_path):
    swept = sweep_dir(tmp_path)
    assert sweep_mismatches(ladder(tmp_path, lr={"from_sweep": swept})) == []


def test_each_changed_setting_is_named_with_both_values_in_one_line(tmp_path):
    swept = sweep_dir(tmp_path)
    job = ladder(
        tmp_path,
        lr={"from_sweep": swept},
        duration={"schedule": "cosine"},
        batch={"coef": 65536.0},
        run={"optim": {"weight_decay": 0.0}},
    )
    assert sweep_mismatches(job) == [
        f"lr.from_sweep: {swept} was swept with duration.schedule 'wsds' (here 'cosine'), "
        "run.optim.weight_decay 0.1 (here 0.0), batch.coef 2048.0 (here 65536.0): its optimum "
        "may not hold under this ladder's settings; set them as the sweep had them, or sweep "
        "again with this ladder's"
    ]


def test_the_batch_rule_is_not_compared_where_the_sweep_varied_the_batch(tmp_path):
    swept = sweep_dir(tmp_path, sweep={"batch_factors": [0.5, 1.0, 2.0]})
    assert (
        sweep_mismatches(ladder(tmp_path, lr={"from_sweep": swept}, batch={"coef": 65536.0})) == []
    )


def test_one_sweep_for_lr_and_batch_is_one_line_naming_both_keys(tmp_path):
    swept = sweep_dir(tmp_path, sweep={"batch_factors": [0.5, 1.0, 2.0]})
    job = ladder(tmp_path, lr={"from_sweep": swept}, batch={"from_sweep": swept}, seq_len=256)
    (line,) = sweep_mismatches(job)
    assert line.startswith(f"lr.from_sweep and batch.from_sweep: {swept} was swept with seq_len")


def test_a_sweep_whose_trials_decayed_at_several_horizons_ran_wsds(tmp_path):
    """Its record says cosine, but its trials ran one WSD-S schedule with a decay at each
    horizon: a cosine ladder is warned, which the record alone would not show."""
    several = {"horizons": [0.25, 0.5], "horizon_trials": "decays"}
    swept = sweep_dir(tmp_path, sweep=several, duration={"schedule": "cosine"})
    (line,) = sweep_mismatches(
        ladder(tmp_path, lr={"from_sweep": swept}, duration={"schedule": "cosine"})
    )
    assert "duration.schedule 'wsds' (here 'cosine')" in line


def test_a_sweep_without_its_record_is_said_not_compared(tmp_path):
    (tmp_path / "bare").mkdir()
    job = ladder(tmp_path, lr={"from_sweep": str(tmp_path / "bare")})
    assert sweep_mismatches(job) == [
        f"lr.from_sweep: {tmp_path / 'bare'} holds no experiment.yaml, so its settings can't be "
        "compared with this ladder's: make sure its schedule, optimizer and batch were these"
    ]


def test_a_setting_the_sweep_recorded_as_null_is_compared(tmp_path):
    """No z-loss in the sweep (null), z-loss in the ladder: a null was read as "not recorded"."""
    swept = sweep_dir(tmp_path)
    job = ladder(
        tmp_path, lr={"from_sweep": swept}, run={"train_module": {"z_loss_multiplier": 1e-4}}
    )
    (line,) = sweep_mismatches(job)
    assert "run.train_module.z_loss_multiplier None (here 0.0001)" in line
