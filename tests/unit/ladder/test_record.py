"""``experiment.yaml`` on ``--resume``: a config that differs from the recorded one is refused,
naming the keys, since Tune restores every trial with the config it was launched with; and any
launch whose runs' dirs hold runs trained otherwise."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from trainer_core.config.diff import changed_keys
from trainer_core.config.loader import ConfigError, from_dict, load_config, to_dict, to_yaml
from trainer_core.ladder import record as ladder_record
from trainer_core.ladder.plan import plan_ladder
from trainer_core.ladder.record import as_launched, plot_ladder_schedule, write_experiment_record
from trainer_core.ray.ladder_run import LadderJobConfig, ladder_trials, run_ladder
from trainer_core.ray.tune_run import check_unchanged_runs

BASE = {"sizes": ["15K"], "lr": {"coef": 6.9e-4}, "run": {"trainer": {"seed": 1}}}


def record(tmp_path, data: dict, resume: bool) -> None:
    job = from_dict(LadderJobConfig, {**data, "dir": str(tmp_path)})
    write_experiment_record(job, plan_ladder(job, None), tmp_path, resume)


def test_resume_with_a_changed_config_is_refused_and_the_record_kept(tmp_path):
    record(tmp_path, BASE, resume=False)
    before = (tmp_path / "experiment.yaml").read_text()
    changed = {**BASE, "lr": {"coef": 1e-3}, "run": {"trainer": {"seed": 2}}}
    with pytest.raises(ConfigError) as err:
        record(tmp_path, changed, resume=True)
    assert str(err.value).startswith(
        f"--resume: lr.coef, run.trainer.seed differ from {tmp_path / 'experiment.yaml'}; "
    )
    assert "launch the changed config into a new --dir" in str(err.value)
    assert (tmp_path / "experiment.yaml").read_text() == before


def test_an_experiment_recorded_before_a_key_existed_resumes_as_it_launched(tmp_path, repo_root):
    """A GPU ladder launched before ``min_rank_tokens``: its record lacks the key, so its resume
    plans with the behaviour it launched with (no floor), not the new default's devices, and
    the record check takes it (it was refused, naming the key; then replanned and refused by
    the runs' configs)."""
    path = repo_root / "workflows" / "configs" / "ladder-gpu.yaml"
    job = load_config(LadderJobConfig, path, [f"--dir={tmp_path}"])
    old = from_dict(LadderJobConfig, {**to_dict(job), "min_rank_tokens": 0})
    launched = plan_ladder(old, None)
    write_experiment_record(old, launched, tmp_path, resume=False)
    recorded = yaml.safe_load((tmp_path / "experiment.yaml").read_text())
    del recorded["min_rank_tokens"]
    (tmp_path / "experiment.yaml").write_text(yaml.safe_dump(recorded))
    resumed = as_launched(job, tmp_path)
    assert resumed.min_rank_tokens == 0
    plans = plan_ladder(resumed, None)
    assert [p.devices for p in plans] == [p.devices for p in launched]
    assert [p.devices for p in plans] != [p.devices for p in plan_ladder(job, None)]
    write_experiment_record(resumed, plans, tmp_path, resume=True)
    given = from_dict(LadderJobConfig, {**to_dict(job), "min_rank_tokens": 4096})
    assert as_launched(given, tmp_path).min_rank_tokens == 4096  # a value given is kept


def test_resume_with_an_entry_added_to_a_mapping_is_refused(tmp_path):
    """A key on one side of a mapping setting is a change: a new duration.multiple_by_size entry
    would be recorded while Tune restores the trial at its launch's multiple."""
    record(tmp_path, BASE, resume=False)
    with pytest.raises(ConfigError, match=r"^--resume: duration.multiple_by_size.15K differs"):
        record(tmp_path, {**BASE, "duration": {"multiple_by_size": {"15K": 16}}}, resume=True)


def test_resume_takes_the_same_config_and_a_new_ray_address(tmp_path):
    """The driver's keys (the Ray address) may change on --resume and are recorded; a new
    launch records its whole config and plan."""

    def recorded() -> tuple[dict, list[dict]]:
        exp = yaml.safe_load((tmp_path / "experiment.yaml").read_text())
        return exp, json.loads((tmp_path / "plan.json").read_text())

    record(tmp_path, BASE, resume=False)
    exp, plan = recorded()
    assert (exp["lr"]["coef"], [row["size"] for row in plan]) == (6.9e-4, ["15K"])
    first_lr = plan[0]["peak lr"]
    record(tmp_path, BASE, resume=True)
    record(tmp_path, {**BASE, "ray": {"address": "ray://head:10001"}}, resume=True)
    assert recorded()[0]["ray"]["address"] == "ray://head:10001"
    record(tmp_path, {**BASE, "lr": {"coef": 1e-3}}, resume=False)  # a new launch may change it
    exp, plan = recorded()
    assert exp["lr"]["coef"] == 1e-3
    assert plan[0]["peak lr"] == pytest.approx(first_lr * 1e-3 / 6.9e-4, rel=1e-4)


def test_changed_keys_are_dotted_and_include_keys_on_one_side():
    old = {"a": 1, "b": {"c": [1, 2], "d": "x"}, "gone": 1}
    new = {"a": 1, "b": {"c": [1, 3], "d": "x"}, "added": 2}
    assert changed_keys(old, new) == ["b.c", "gone", "added"]


def test_a_relaunch_into_the_dir_with_other_run_settings_is_refused_before_anything(tmp_path):
    """Without --resume too: a size whose run dir holds a run trained with another LR would be
    resumed (or, finished, reported) as this config's run. Refused before the record is
    rewritten or Ray started; sizes added to the ladder, and unchanged ones, pass."""
    first = from_dict(LadderJobConfig, {**BASE, "dir": str(tmp_path)})
    write_experiment_record(first, plan_ladder(first, None), tmp_path)
    for spec in ladder_trials(first, plan_ladder(first, None)):  # as a launch leaves them
        run_dir = tmp_path / "runs" / spec.name
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(to_yaml(spec.config))
    before = (tmp_path / "experiment.yaml").read_text()
    changed = from_dict(LadderJobConfig, {**BASE, "dir": str(tmp_path), "lr": {"coef": 1e-3}})
    with pytest.raises(ConfigError) as e:
        run_ladder(changed, plan_ladder(changed, None), resume=False)
    # in the ladder's keys, with its remedy (was the run's optim.lr, and a new run dir)
    assert str(e.value) == (
        f"dir: {tmp_path / 'runs' / '15K' / 'config.yaml'} records run 15K trained with other lr; "
        "going on would keep its weights under the new settings: launch the changed config into "
        "a new --dir, or undo the change"
    )
    assert (tmp_path / "experiment.yaml").read_text() == before
    grown = from_dict(LadderJobConfig, {**BASE, "dir": str(tmp_path), "sizes": ["15K", "25K"]})
    check_unchanged_runs(ladder_trials(grown, plan_ladder(grown, None)), grown.planned())


def test_a_size_listed_twice_is_refused():
    with pytest.raises(ConfigError, match="sizes: 15K listed more than once"):
        from_dict(LadderJobConfig, {**BASE, "sizes": ["15K", "25K", "15K"], "dir": "x"})
    job = from_dict(LadderJobConfig, {**BASE, "dir": "x"})
    with pytest.raises(ConfigError, match="sizes: 15K listed more than once"):
        plan_ladder(job, ["15K", "15K"])


def test_resume_with_other_sizes_is_refused_and_the_plan_kept(tmp_path):
    """Tune restores the trials it launched: a --resume without the launch's --sizes trained
    one size and rewrote plan.json to list all of them."""
    job = from_dict(LadderJobConfig, {**BASE, "sizes": ["15K", "25K"], "dir": str(tmp_path)})
    write_experiment_record(job, plan_ladder(job, ["15K"]), tmp_path)
    before = (tmp_path / "plan.json").read_text()
    with pytest.raises(
        ConfigError, match=r"--resume: the sizes 15K, 25K differ from the launch's 15K"
    ):
        write_experiment_record(job, plan_ladder(job, None), tmp_path, resume=True)
    assert (tmp_path / "plan.json").read_text() == before
    write_experiment_record(job, plan_ladder(job, ["15K"]), tmp_path, resume=True)


def test_resume_names_one_changed_key_in_the_singular(tmp_path):
    record(tmp_path, BASE, resume=False)
    with pytest.raises(ConfigError) as err:
        record(tmp_path, {**BASE, "lr": {"coef": 1e-3}}, resume=True)
    assert str(err.value).startswith(
        f"--resume: lr.coef differs from {tmp_path / 'experiment.yaml'}; "
    )


def test_resume_takes_a_copied_experiment_where_it_now_is(tmp_path):
    """The record names the dir it was launched in; a copy resumed in its new dir was refused
    ("dir differ"), while the same command without --resume went on from its checkpoints."""
    first, moved = tmp_path / "first", tmp_path / "moved"
    first.mkdir()
    record(first, BASE, resume=False)
    shutil.copytree(first, moved)
    record(moved, BASE, resume=True)
    assert yaml.safe_load((moved / "experiment.yaml").read_text())["dir"] == str(moved)
    with pytest.raises(ConfigError, match=r"^--resume: lr\.coef differs from "):
        record(moved, {**BASE, "lr": {"coef": 1e-3}}, resume=True)


def test_the_schedule_plotted_is_the_largest_sizes_wherever_it_is_listed(tmp_path, monkeypatch):
    """``sizes: [200K, 15K, 50K]`` plotted 50K's schedule (the last listed) as the ladder's."""
    drawn = {}

    def plot(schedule, steps, lr, path, title):
        drawn.update(steps=steps, lr=lr, title=title)
        return path

    monkeypatch.setattr(ladder_record, "plot_schedule", plot)
    job = from_dict(
        LadderJobConfig, {**BASE, "sizes": ["200K", "15K", "50K"], "dir": str(tmp_path)}
    )
    plans = plan_ladder(job)
    plot_ladder_schedule(job, plans, tmp_path / "lr.png")
    largest = plans[0]
    assert largest.size == "200K" and largest.num_params == max(p.num_params for p in plans)
    assert drawn == {"steps": largest.steps, "lr": largest.lr, "title": "demo 200K: LR schedule"}
