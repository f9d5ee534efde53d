"""Early stopping that compares trials only within a group: one model size and run length.

Tune runs one scheduler for a whole experiment, but a sweep's eval losses are comparable only
between trials of the same size: a small model at its best LR still loses to a larger one at a
poor LR. With one ASHA over all trials, every small-model trial could be cut at the first rung by
whichever larger model reached it first. Runs of one size to different horizons differ the same
way (their schedules anneal at different points). So each group gets its own scheduler (own
rungs, own ``max_t``) and this one routes every trial to its group's.
"""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler


def trial_group(trial) -> str:
    """The group tag a sweep trial carries (see ``TrialSpec.as_param``), else its size."""
    tags = trial.config["trial"]["tags"]
    return tags.get("group", tags["size"])


class GroupedScheduler(FIFOScheduler):
    """Delegates each trial's results to ``schedulers[group]``; trials start in submission order."""

    def __init__(self, schedulers: dict[str, TrialScheduler]):
        super().__init__()
        self.schedulers = schedulers

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        results = [s.set_search_properties(metric, mode, **spec) for s in self.schedulers.values()]
        return all(results)

    def on_trial_add(self, tune_controller, trial) -> None:
        self.schedulers[trial_group(trial)].on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial) -> None:
        self.schedulers[trial_group(trial)].on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        return self.schedulers[trial_group(trial)].on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        self.schedulers[trial_group(trial)].on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self.schedulers[trial_group(trial)].on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return "\n".join(f"{group}: {s.debug_string()}" for group, s in self.schedulers.items())
