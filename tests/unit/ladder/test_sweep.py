"""Sweep planning without Ray: each size's LR x batch grid at its horizons, the rungs, the
shortened duration, each trial's run config and group, and where the grid widens."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest

from trainer_core.analysis import widen_horizons, widen_sweep
from trainer_core.config.loader import ConfigError, load_config
from trainer_core.ladder.plan import plan_ladder
from trainer_core.ladder.sweep import (
    SweepConfig,
    at_batch,
    horizon_route,
    plan_sweep,
    rung_steps,
    sweep_durations,
    sweep_lrs,
    trial_config,
)
from trainer_core.ray.sweep_run import SweepJobConfig, sweep_trials
from trainer_core.train.schedule import decay_windows


@pytest.fixture(scope="module")
def demo(repo_root):
    return load_config(SweepJobConfig, repo_root / "workflows/configs/ladder-demo.yaml")


def cosine(ladder):
    return replace(ladder, duration=replace(ladder.duration, schedule="cosine"))


def decay_ends(plan) -> list[int]:
    return [end for _, end in decay_windows(plan.steps, plan.schedule)]


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
    (short_ladder,) = sweep_durations(demo, sweep)
    for plan in plan_ladder(short_ladder):
        assert plan.chinchilla_multiple == pytest.approx(0.25)
        assert plan.steps < full[plan.size].steps
        assert rung_steps(plan, sweep) == max(1, round(0.25 * plan.steps))
        # one horizon keeps the ladder's decays: still an annealed point at each
        assert len(decay_ends(plan)) == len(demo.duration.decay_points)
    # full_length keeps the ladder's own durations
    (same,) = sweep_durations(demo, SweepConfig(full_length=True))
    assert [p.steps for p in plan_ladder(same)] == [p.steps for p in full.values()]


def test_wsds_horizons_are_one_run_whose_decays_end_at_each(demo):
    """Under WSD-S one trial per (LR, batch) runs to the longest horizon, a decay ending at each
    horizon; batches are multiples of the planned one, each plan's steps giving the same tokens."""
    sweep = SweepConfig(horizons=[1.0, 0.25, 0.5], batch_factors=[0.5, 1.0, 2.0])
    assert horizon_route(demo, sweep) == "decays"
    runs = plan_sweep(demo, sweep, ["25K", "50K"])
    assert len(runs) == 2 * 3
    (ladder,) = sweep_durations(demo, sweep)
    planned = {p.size: p for p in plan_ladder(ladder, ["25K", "50K"])}
    for run in runs:
        plan = run.plan
        assert run.group == f"{plan.size}@1x"
        assert plan.chinchilla_multiple == 1.0
        ends = decay_ends(plan)
        assert [e / plan.steps for e in ends] == pytest.approx([0.25, 0.5, 1.0], abs=2 / plan.steps)
        assert plan.tokens == pytest.approx(planned[plan.size].tokens, rel=0.01)
        assert plan.batch_tokens % (plan.micro_batch_seqs * plan.dp_size * 128) == 0
    batches = sorted(r.plan.batch_tokens for r in runs if r.plan.size == "25K")
    base = planned["25K"].batch_tokens
    assert batches == [base // 2, base, 2 * base]
    # the planned batch comes first among a size's runs
    assert runs[0].plan.batch_tokens == planned[runs[0].plan.size].batch_tokens


def test_cosine_horizons_are_one_run_each_in_groups_of_their_own(demo):
    sweep = SweepConfig(horizons=[0.25, 0.5], batch_factors=[1.0, 2.0])
    ladder = cosine(demo)
    assert horizon_route(ladder, sweep) == "runs"
    runs = plan_sweep(ladder, sweep, ["25K"])
    assert sorted({r.group for r in runs}) == ["25K@0.25x", "25K@0.5x"]
    assert sorted(r.plan.chinchilla_multiple for r in runs) == [0.25, 0.25, 0.5, 0.5]
    assert all(decay_ends(r.plan) == [r.plan.steps] for r in runs)
    # WSD-S can be told to take a run per horizon too
    forced = plan_sweep(demo, replace(sweep, horizon_trials="runs"), ["25K"])
    assert sorted({r.group for r in forced}) == ["25K@0.25x", "25K@0.5x"]


def test_horizons_are_capped_at_the_ladders_duration_and_batches_deduplicated(demo):
    sweep = SweepConfig(horizons=[0.5, 4.0], batch_factors=[1.0, 1.001])
    runs = plan_sweep(demo, sweep, ["25K"])
    assert len(runs) == 1
    assert runs[0].plan.chinchilla_multiple == demo.duration.chinchilla_multiple == 1.0
    assert [e / runs[0].plan.steps for e in decay_ends(runs[0].plan)] == pytest.approx(
        [0.5, 1.0], abs=0.01
    )


def test_a_trial_is_its_size_run_at_its_lr_evaluating_at_every_rung(demo):
    sweep = SweepConfig()
    (ladder,) = sweep_durations(demo, sweep)
    plan = plan_ladder(ladder, ["25K"])[0]
    cfg = trial_config(plan, sweep, lr=3e-3)
    assert cfg.optim.lr == 3e-3
    assert cfg.trainer.eval_interval == rung_steps(plan, sweep)
    assert (cfg.model, cfg.trainer.max_steps) == (plan.config.model, plan.config.trainer.max_steps)


def test_trials_cover_lr_x_batch_grouped_by_size_and_run_length_centre_first(demo, tmp_path):
    sweep = SweepConfig(factors=[0.5, 1.0, 2.0], batch_factors=[0.5, 1.0], horizons=[0.25, 0.5])
    job = replace(cosine(demo), sweep=sweep, dir=str(tmp_path))
    specs = sweep_trials(job, plan_sweep(job, sweep, ["25K", "50K"]))
    assert len(specs) == 2 * 2 * 3 * 2 == len({s.name for s in specs})
    groups = [s.tags["group"] for s in specs]
    # costliest group first, each group's trials together
    assert list(dict.fromkeys(groups)) == ["50K@0.5x", "50K@0.25x", "25K@0.5x", "25K@0.25x"]
    first = [s for s in specs if s.tags["group"] == "25K@0.25x"]
    assert first[0].tags["lr_factor"] == pytest.approx(1.0)
    assert {(s.config.optim.lr, s.config.trainer.global_batch_size) for s in first} == {
        (lr, b) for lr in {s.config.optim.lr for s in first} for b in (1024, 2048)
    }
    for s in specs:
        assert s.config.trainer.run_dir.startswith(str(tmp_path))
        assert s.config.trainer.eval_interval == max(1, round(0.25 * s.config.total_steps))


def test_early_stopping_groups_compare_at_equal_tokens(demo, tmp_path):
    """One ASHA per (size, run length); its clock is tokens, its first rung the group's earliest
    first eval, its end the longest run: batches in a group are compared at equal tokens."""
    from trainer_core.ray.sweep_run import TIME_ATTR, early_stopper

    sweep = SweepConfig(factors=[1.0, 2.0], batch_factors=[0.5, 1.0, 2.0], horizons=[0.25, 0.5])
    job = replace(cosine(demo), sweep=sweep, dir=str(tmp_path))
    specs = sweep_trials(job, plan_sweep(job, sweep, ["25K"]))
    stopper = early_stopper(job, specs)
    assert sorted(stopper.schedulers) == ["25K@0.25x", "25K@0.5x"]
    asha = stopper.schedulers["25K@0.5x"]
    members = [s.config for s in specs if s.tags["group"] == "25K@0.5x"]
    assert asha._time_attr == TIME_ATTR == "tokens"
    assert asha._max_t == max(c.total_steps * c.trainer.global_batch_size for c in members)
    first_rung = min(milestone for milestone, _ in asha._brackets[0]._rungs)
    assert first_rung == min(c.trainer.eval_interval * c.trainer.global_batch_size for c in members)
    assert early_stopper(replace(job, sweep=replace(sweep, early_stopping="none")), specs) is None


def test_factors_that_name_the_same_trial_are_refused(demo, tmp_path):
    """Factors equal, or equal to a name's 4 digits, made two trials of one name: one run dir."""
    for factors in ([1.0, 1.0, 2.0], [1.0, 1.00001]):
        sweep = SweepConfig(factors=factors)
        job = replace(demo, sweep=sweep, dir=str(tmp_path))
        with pytest.raises(ConfigError, match=r"1 trials share a name .*15K-c0\.25-b2048-lr8"):
            sweep_trials(job, plan_sweep(job, sweep, ["15K"]))


def sweep_table(rows: list[tuple[float, int, float]], diverged=(), stopped=()) -> pd.DataFrame:
    """(lr, batch, compared loss) trials of one group, named ``lr<lr>``."""
    return pd.DataFrame(
        [
            {
                "size": "s",
                "group": "s@1x",
                "name": f"lr{lr:g}",
                "lr": lr,
                "batch": b,
                "compared_loss": loss,
                "diverged": (lr, b) in diverged,
                "stopped_early": (lr, b) in stopped,
            }
            for lr, b, loss in rows
        ]
    )


GRID = [(lr, b) for lr in (1e-3, 2e-3, 4e-3) for b in (1024, 2048, 4096)]


def bowl(lr_star: float, b_star: float):
    return [(lr, b, math.log(lr / lr_star) ** 2 + math.log(b / b_star) ** 2) for lr, b in GRID]


def test_widening_adds_an_lr_beyond_the_edge_at_the_best_batch():
    assert widen_sweep(sweep_table(bowl(2e-3, 2048))) == {}
    assert widen_sweep(sweep_table(bowl(9e-3, 2048))) == {"s@1x": [(pytest.approx(8e-3), 2048)]}
    assert widen_sweep(sweep_table(bowl(3e-4, 1024))) == {
        "s@1x": [(pytest.approx(5e-4), 1024), (pytest.approx(1e-3), 512)]
    }


def test_widening_adds_a_batch_beyond_the_edge_at_the_best_lr():
    assert widen_sweep(sweep_table(bowl(2e-3, 20000))) == {"s@1x": [(pytest.approx(2e-3), 8192)]}
    # one batch tried: the batch is not swept, never widened
    single = sweep_table([(lr, 2048, loss) for lr, b, loss in bowl(2e-3, 20000) if b == 2048])
    assert widen_sweep(single) == {}


def test_widening_stops_below_divergence_and_a_dead_group_tries_lower_lrs():
    rows = bowl(9e-3, 2048) + [(8e-3, 2048, math.nan)]
    assert widen_sweep(sweep_table(rows, diverged={(8e-3, 2048)})) == {}
    dead = sweep_table(
        [(4e-3, b, math.nan) for b in (1024, 2048)], diverged={(4e-3, 1024), (4e-3, 2048)}
    )
    assert widen_sweep(dead) == {"s@1x": [(pytest.approx(2e-3), 1024), (pytest.approx(2e-3), 2048)]}


def test_a_diverged_trial_beyond_the_best_brackets_it_in_lr_and_in_batch():
    """A diverged trial is worse than every finished one, as in the optimum: above the best LR
    (9e-3, beyond the grid step of 8e-3 it asked for) or at a larger batch (8192: it asked to
    run that trial again), it brackets the best, and nothing is widened."""
    above = bowl(9e-3, 2048) + [(9e-3, 2048, math.nan)]
    assert widen_sweep(sweep_table(above, diverged={(9e-3, 2048)})) == {}
    larger = bowl(2e-3, 20000) + [(2e-3, 8192, math.nan)]
    assert widen_sweep(sweep_table(larger, diverged={(2e-3, 8192)})) == {}


def test_a_batch_beyond_the_grid_is_replanned_to_a_valid_batch(demo):
    (ladder,) = sweep_durations(demo, SweepConfig(horizons=[0.25, 1.0]))
    run = at_batch(ladder, "25K", 3000)
    plan = run.plan
    assert plan.batch_tokens % 128 == 0 and abs(plan.batch_tokens - 3000) <= 128
    assert plan.tokens == pytest.approx(plan_ladder(ladder, ["25K"])[0].tokens, rel=0.01)
    assert run.group == "25K@1x"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("factors", [], "factors"),
        ("factors", [0.5, -1.0], "factors"),
        ("batch_factors", [0.0], "batch_factors"),
        ("horizons", [0.3], "horizons"),
        ("duration_multiple", 0.3, "duration_multiple: 0.3 is not allowed; must be a power of two"),
        ("grace_fraction", 0.0, "grace_fraction"),
        ("reduction_factor", 1, "reduction_factor"),
        ("widen_rounds", -1, "widen_rounds"),
    ],
)
def test_bad_sweep_settings_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        SweepConfig(**{field: value})


def test_full_length_and_horizons_do_not_mix():
    with pytest.raises(ConfigError, match="full_length"):
        SweepConfig(full_length=True, horizons=[0.5])


def horizon_points(optima: dict[float, float], batch: int = 2048) -> pd.DataFrame:
    """One group's trials (lr 1e-3, 2e-3, 4e-3 at one batch) read at each horizon D, whose
    best LR is ``optima[D]``: the annealed points the laws read, with their run names."""
    return pd.DataFrame(
        [
            {
                "name": f"lr{lr:g}",
                "D": d,
                "lr": lr,
                "batch": batch,
                "loss": math.log(lr / best) ** 2,
            }
            for d, best in optima.items()
            for lr in (1e-3, 2e-3, 4e-3)
        ]
    )


def test_a_short_horizon_whose_best_lr_is_at_the_edge_widens_the_grid():
    """LR* falls with the horizon: the final one is bracketed (no widening by it), the first
    wants more than the grid's top, and its cell of LR*(N, D) stayed open."""
    points = horizon_points({1e5: 9e-3, 4e5: 2e-3})
    final = points[points["D"] == 4e5]
    table = sweep_table(
        [(lr, 2048, loss) for lr, loss in zip(final["lr"], final["loss"], strict=True)]
    )
    assert widen_sweep(table) == {}
    assert widen_horizons(points, table) == {"s@1x": [(pytest.approx(8e-3), 2048)]}
    # a diverged trial at the LR beyond caps it, as at the final horizon
    capped = pd.concat([table, sweep_table([(8e-3, 2048, math.nan)], diverged={(8e-3, 2048)})])
    assert widen_horizons(points, capped) == {}
    assert widen_horizons(horizon_points({1e5: 2e-3, 4e5: 2e-3}), table) == {}


def test_trials_stopped_before_a_horizon_count_there_as_tried_and_worse():
    """Early stopping cut the low LRs before the horizon: the one trial that reached it is not
    an optimum at both edges (the grid widened both ways with a default step). The cut trials
    are at the horizon with an infinite loss, as hparam_table puts them."""
    reached = horizon_points({4e5: 4e-3})
    reached.loc[reached["lr"] < 4e-3, "loss"] = math.inf
    rows = [(1e-3, 2048, 5.0), (2e-3, 2048, 4.0), (4e-3, 2048, 1.0)]
    table = sweep_table(rows, stopped={(1e-3, 2048), (2e-3, 2048)})
    assert widen_horizons(reached, table) == {"s@1x": [(pytest.approx(8e-3), 2048)]}


def test_a_trial_that_diverged_after_a_horizon_counts_there_with_its_loss():
    """The top LR reached the short horizon, best there, then diverged: that cell's optimum is
    at the grid's edge (its annealed loss is final), and the longer one is bracketed by the
    divergence. The trial was listed twice at the short horizon (its loss, and as diverged),
    and the diverged copy capped the step up below its own LR: the cell was never widened."""
    points = horizon_points({1e5: 9e-3, 4e5: 2e-3})
    points.loc[(points["D"] == 4e5) & (points["lr"] == 4e-3), "loss"] = math.inf
    rows = [(1e-3, 2048, 1.0), (2e-3, 2048, 0.0), (4e-3, 2048, math.nan)]
    table = sweep_table(rows, diverged={(4e-3, 2048)})
    assert widen_sweep(table) == {}
    assert widen_horizons(points, table) == {"s@1x": [(pytest.approx(8e-3), 2048)]}
