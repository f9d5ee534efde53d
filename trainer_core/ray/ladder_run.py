"""Running a ladder on Ray Tune: checks before any trial, one trial per size, a benchmark mode."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from trainer_core.config.decode import ConfigError
from trainer_core.config.sections import ScheduleConfig, TrainConfig
from trainer_core.config.sizes import check_size
from trainer_core.io import storage
from trainer_core.io.run_dir import LR_SCHEDULE
from trainer_core.ladder.config import (
    EVAL_BATCHES,
    PLANNED,
    LadderConfig,
    check_not_given,
    check_unplanned,
)
from trainer_core.ladder.plan import SizePlan, plan_ladder
from trainer_core.ladder.record import plot_ladder_schedule, write_experiment_record
from trainer_core.ray.run_config import RayConfig, RayTrainConfig
from trainer_core.ray.tune_run import TrialSpec, costliest_first

PLANNED_RAY = {"num_workers": "max_devices", "use_gpu": "device_type"}
"""The Ray settings the plan fills in per size -> the ladder key each is planned from."""

SIZES_HELP = {"--sizes": "only these sizes, comma-separated (e.g. 15K,25K)"}
"""``--help``'s line for the flag a ladder and its LR sweep share."""


@dataclass
class LadderJobConfig(LadderConfig):
    """A ladder plus how its runs use Ray (per-worker resources, restarts)."""

    ray: RayConfig = field(default_factory=RayConfig)
    """``num_workers`` and ``use_gpu`` are planned (from ``max_devices`` and ``device_type``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_unplanned(self.ray, RayConfig(), PLANNED_RAY, "ray.")

    def check_given(self, data: dict) -> None:
        super().check_given(data)
        check_not_given(data.get("ray"), PLANNED_RAY, "ray.")


def planned_settings() -> dict[str, str]:
    """Every setting the plan fills in (dotted) -> the ladder key it is planned from: ``--help``
    says so instead of a default that is never used."""
    return {
        **{f"run.{key}": owner for key, owner in PLANNED.items()},
        f"run.{EVAL_BATCHES}": "eval_tokens, when set (> 0)",
        **{f"ray.{key}": owner for key, owner in PLANNED_RAY.items()},
    }


def on_ray(
    cfg: TrainConfig, plan: SizePlan, job: LadderJobConfig, sweep: bool = False
) -> RayTrainConfig:
    """A run of ``plan`` on Ray: one worker per planned device, and the runner ``ray.runner``
    picks for a ladder's (or, ``sweep``, a sweep's) trials."""
    if job.ray.runner == "trial" and plan.devices > 1:
        raise ConfigError(
            f"ray.runner: 'trial' trains a run's one worker in its Tune trial's process, and "
            f"size {plan.size} is planned on {plan.devices} devices (max_devices "
            f"{job.max_devices}): use 'train' (or 'auto')"
        )
    ray = replace(job.ray, num_workers=plan.devices, use_gpu=job.uses_gpu)
    return RayTrainConfig.of(cfg, ray.for_trials(sweep))


def ladder_trials(job: LadderJobConfig, plans: list[SizePlan]) -> list[TrialSpec]:
    return [
        TrialSpec(
            name=p.size,
            config=on_ray(p.config, p, job),
            tags={"ladder": job.name, "size": p.size, "lr_source": p.lr_source},
        )
        for p in costliest_first(plans)
    ]


def run_ladder(job: LadderJobConfig, plans: list[SizePlan], resume: bool):
    """Run every planned size (``plan_ladder``, after ``preflight``) as a Tune trial; returns
    the ResultGrid (None: every run had ended before, nothing started)."""
    from trainer_core.ray.tune_run import check_unchanged_runs, run_trials

    specs = ladder_trials(job, plans)
    check_unchanged_runs(specs, job.planned())
    exp_dir = job.exp_dir
    write_experiment_record(job, plans, exp_dir, resume)
    # after the checks: a refused relaunch left the experiment's plot showing its schedule
    print(
        f"LR schedule plot: {plot_ladder_schedule(job, plans, storage.join(exp_dir, LR_SCHEDULE))}"
    )
    return run_trials(specs, exp_dir, tune_settings(job), resume).grid


def tune_settings(job: LadderJobConfig):
    """The ladder's Tune settings: as many trials at once as ``ray.max_concurrent_trials`` names
    (0: what the cluster holds at launch)."""
    from trainer_core.ray.tune_run import TuneSettings

    return TuneSettings(max_concurrent=job.ray.max_concurrent_trials)


def benchmark_size(job: LadderJobConfig, size: str, steps: int = 20) -> dict:
    """A short run with no checkpoints or evals: tokens/s per device and MFU after warm-up.
    ``size`` is checked as ``--benchmark``'s value, where the user typed it, not ``sizes``."""
    from trainer_core.ray.runtime import init_ray
    from trainer_core.ray.train_driver import run_training

    check_size(size, "--benchmark", job.size_table)
    (plan,) = plan_ladder(job, [size])
    planned = plan.config
    cfg = replace(
        planned,
        schedule=ScheduleConfig(kind="constant", warmup=0),
        trainer=replace(
            planned.trainer,
            max_steps=steps,
            log_interval=max(steps // 4, 1),
            eval_batches=0,
            run_dir=str(storage.join(job.dir, "benchmarks", f"{size}-{os.getpid()}")),
        ),
        checkpoint=replace(planned.checkpoint, enabled=False),
        tracking=replace(planned.tracking, wandb=False),
    )
    cfg = on_ray(cfg, plan, job)
    init_ray(job.ray.address)
    summary = run_training(cfg)
    return {
        "size": size,
        "devices": plan.devices,
        "tokens_per_s_per_device": summary.get("throughput/tokens_per_s_per_device"),
        "mfu": summary.get("throughput/mfu"),
        "run_dir": cfg.trainer.run_dir,
    }
