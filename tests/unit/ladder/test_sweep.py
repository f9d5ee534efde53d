"""LR sweep planning without Ray: each size's LR grid, the rungs, the shortened duration and each
trial's run config (the Ray layer only schedules what these return)."""

from __future__ import annotations

import math

import pytest

from trainer_core.config.loader import ConfigError, load_config
from trainer_core.ladder.plan import plan_ladder
from trainer_core.ladder.sweep import (
    SweepConfig,
    rung_steps,
    sweep_durations,
    sweep_lrs,
    trial_config,
)
from trainer_core.ray.sweep_run import SweepJobConfig


@pytest.fixture(scope="module")
def demo(repo_root):
    return load_config(SweepJobConfig, repo_root / "workflows/configs/ladder-demo.yaml")


def test_grid_lrs_are_the_formula_lr_times_each_factor_centre_out(demo):
    plan = plan_ladder(demo, ["50K"])[0]
    sweep = SweepConfig(factors=[0.25, 0.5, 1.0, 2.0, 4.0])
    lrs = sweep_lrs(plan, sweep, seed=0)
    assert [lr / plan.lr for lr in lrs] == pytest.approx([1.0, 0.5, 2.0, 0.25, 4.0])


def test_random_lrs_are_log_uniform_within_the_factors_and_seeded(demo):
    plan = plan_ladder(demo, ["50K"])[0]
    sweep = SweepConfig(search="random", factors=[0.125, 8.0], num_samples=6)
    lrs = sweep_lrs(plan, sweep, seed=3)
    assert len(lrs) == 6
    assert all(0.125 * plan.lr <= lr <= 8.0 * plan.lr for lr in lrs)
    assert lrs == sweep_lrs(plan, sweep, seed=3)
    assert lrs != sweep_lrs(plan, sweep, seed=4)
    dist = [abs(math.log(lr / plan.lr)) for lr in lrs]
    assert dist == sorted(dist)


def test_sweep_runs_are_shorter_and_rungs_follow_their_steps(demo):
    sweep = SweepConfig(duration_multiple=0.25, grace_fraction=0.25)
    full = {p.size: p for p in plan_ladder(demo)}
    short = {p.size: p for p in plan_ladder(sweep_durations(demo, sweep))}
    for size, plan in short.items():
        assert plan.chinchilla_multiple == pytest.approx(0.25)
        assert plan.steps < full[size].steps
        assert rung_steps(plan, sweep) == max(1, round(0.25 * plan.steps))
    # full_length keeps the ladder's own durations
    same = plan_ladder(sweep_durations(demo, SweepConfig(full_length=True)))
    assert [p.steps for p in same] == [full[p.size].steps for p in same]


def test_a_trial_is_its_size_run_at_its_lr_evaluating_at_every_rung(demo):
    sweep = SweepConfig()
    plan = plan_ladder(sweep_durations(demo, sweep), ["25K"])[0]
    cfg = trial_config(plan, sweep, lr=3e-3)
    assert cfg.optim.lr == 3e-3
    assert cfg.trainer.eval_interval == rung_steps(plan, sweep)
    assert (cfg.model, cfg.trainer.max_steps) == (plan.config.model, plan.config.trainer.max_steps)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("factors", [], "factors"),
        ("factors", [0.5, -1.0], "factors"),
        ("grace_fraction", 0.0, "grace_fraction"),
        ("reduction_factor", 1, "reduction_factor"),
        ("widen_rounds", -1, "widen_rounds"),
    ],
)
def test_bad_sweep_settings_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        SweepConfig(**{field: value})
