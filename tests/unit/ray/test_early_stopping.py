"""Sweep scheduling: early stopping compares LRs within a size; wall time against the ideal;
failed trials named by run."""

from __future__ import annotations

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from trainer_core.ray.early_stopping import GroupedScheduler

CONTINUE, STOP = TrialScheduler.CONTINUE, TrialScheduler.STOP


def asha() -> ASHAScheduler:
    return ASHAScheduler(time_attr="step", max_t=8, grace_period=2, reduction_factor=2)


def trial(size: str, group: str | None = None) -> Trial:
    tags = {"size": size} | ({"group": group} if group else {})
    return Trial("trial_driver", config={"trial": {"tags": tags}}, stub=True)


def decisions(scheduler: TrialScheduler, results: list[tuple[str, float]]) -> list[str]:
    """Each (size, eval loss at step 2) as a new trial reaching the first rung, in order."""
    assert scheduler.set_search_properties("eval/loss", "min")
    out = []
    for size, loss in results:
        t = trial(size)
        scheduler.on_trial_add(None, t)
        out.append(scheduler.on_trial_result(None, t, {"step": 2, "eval/loss": loss}))
    return out


RESULTS = [("3M", 2.0), ("3M", 2.1), ("1M", 3.0), ("1M", 3.5), ("1M", 2.9)]


def test_each_size_has_its_own_rungs():
    per_size = GroupedScheduler({"1M": asha(), "3M": asha()})
    # 3M: 2.1 is worse than 2.0 at the rung; 1M: 3.5 is worse than 3.0, but 3.0 and 2.9 are
    # judged against 1M trials only, not against the larger model's lower losses.
    assert decisions(per_size, RESULTS) == [CONTINUE, STOP, CONTINUE, STOP, CONTINUE]
    assert "1M: Using AsyncHyperBand" in per_size.debug_string()


def test_runs_of_one_size_to_different_horizons_are_judged_apart():
    """A sweep's group tag (size and run length) picks the scheduler; a shorter run's higher
    loss at the rung is not held against it by the longer runs of its size."""
    grouped = GroupedScheduler({"1M@1x": asha(), "1M@0.25x": asha()})
    assert grouped.set_search_properties("eval/loss", "min")
    out = []
    for group, loss in [("1M@1x", 2.0), ("1M@1x", 2.5), ("1M@0.25x", 3.0), ("1M@0.25x", 2.9)]:
        t = trial("1M", group)
        grouped.on_trial_add(None, t)
        out.append(grouped.on_trial_result(None, t, {"step": 2, "eval/loss": loss}))
    assert out == [CONTINUE, STOP, CONTINUE, CONTINUE]


def test_one_shared_asha_would_cut_the_small_model_for_being_small():
    assert decisions(asha(), RESULTS)[2:] == [STOP, STOP, STOP]


def test_concurrency_report_against_the_ideal_and_after_a_resume():
    from ray.tune import Result

    from trainer_core.ray.tune_run import TrialsRun

    grid = [Result({"time_total_s": t}, None, None, "/tmp") for t in (100.0, 60.0, 40.0)]
    report = TrialsRun(grid, concurrency=2, wall_s=110.0).concurrency_report()
    assert report == (
        "3 trials, 2 at a time: sum of trial times 200 s, ideal wall 100 s, "
        "actual wall 110 s (1.10x ideal)"
    )
    resumed = TrialsRun(grid, concurrency=2, wall_s=30.0, restored=True).concurrency_report()
    assert "ideal" not in resumed.split("(")[0] and "resumed" in resumed


def test_a_trial_that_never_ran_is_named_by_its_run():
    """A trial whose driver died before it started (a lost node, say) has no config in its
    result: the experiment's failure still names the run, by its trial dir."""
    from ray.tune import Result

    from trainer_core.ray.tune_run import trial_failures

    error = RuntimeError("The actor died unexpectedly.\nThe actor never ran.")
    never_ran = Result({}, None, error, "/exp/tune/3M")
    assert never_ran.config is None
    assert trial_failures([never_ran]) == {"3M": "The actor never ran."}
