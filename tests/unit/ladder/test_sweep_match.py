"""A ladder taking its LR or batch from a sweep is warned of each setting it changed from the
sweep's, since the optimum belongs to them (a cosine ladder planned from a WSD-S sweep at a
32x smaller batch said nothing)."""

from __future__ import annotations

import yaml

from trainer_core.config.loader import from_dict, to_dict
from trainer_core.ladder.sweep_match import sweep_mismatches
from trainer_core.ray.ladder_run import LadderJobConfig

BASE = {"sizes": ["15K"], "duration": {"schedule": "wsds"}, "batch": {"coef": 2048.0}}


def sweep_dir(tmp_path, batch_factors=(1.0,), **changes):
    """A sweep's experiment.yaml: the base ladder's settings with ``changes``."""
    job = from_dict(LadderJobConfig, {**BASE, **changes, "dir": str(tmp_path / "sweep")})
    record = {**to_dict(job), "sweep": {"batch_factors": list(batch_factors)}}
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
    swept = sweep_dir(tmp_path, batch_factors=(0.5, 1.0, 2.0))
    job = ladder(tmp_path, lr={"from_sweep": swept}, batch={"coef": 65536.0})
    assert sweep_mismatches(job) == []
    taken = ladder(tmp_path, batch={"coef": 65536.0, "from_sweep": swept})
    assert sweep_mismatches(taken) == []
