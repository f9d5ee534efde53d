"""Running a ladder on Ray Tune: checks before any trial, one trial per size, a benchmark mode."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainer_core.configio import ConfigError, from_dict, to_dict, to_yaml
from trainer_core.data import open_token_data
from trainer_core.ladder import LadderConfig, SizePlan, plan_ladder, run_config
from trainer_core.paths import check_output_dir
from trainer_core.ray.config import RayConfig, RayTrainConfig
from trainer_core.ray.tune_run import TrialSpec, costliest_first


@dataclass
class LadderJobConfig(LadderConfig):
    """A ladder plus how its runs use Ray (per-worker resources, restarts)."""

    ray: RayConfig = field(default_factory=RayConfig)


def ray_run_config(
    plan: SizePlan, job: LadderJobConfig, run_name: str, lr: float | None = None
) -> RayTrainConfig:
    data = to_dict(run_config(plan, job, run_name, lr))
    data["ray"] = {**to_dict(job.ray), "num_workers": plan.devices, "use_gpu": job.uses_gpu}
    return from_dict(RayTrainConfig, data)


def experiment_kind(record: dict) -> str:
    """ "LR sweep" or "ladder", from a job's config as a dict (an experiment.yaml reads as one)."""
    return "LR sweep" if "sweep" in record else "ladder"


def preflight(job: LadderJobConfig) -> None:
    """Fail before any trial starts: unreadable data / tokenizer mismatch, unwritable output dir,
    or a dir that already holds the other kind of experiment, whose runs and Tune state this one
    would mix with."""
    open_token_data(job.data, job.vocab_size)
    out = Path(job.dir)
    record = out / "experiment.yaml"
    if record.is_file():
        found = experiment_kind(yaml.safe_load(record.read_text()) or {})
        kind = experiment_kind(to_dict(job))
        if found != kind:
            raise ConfigError(
                f"dir: {str(out)!r} already holds a different experiment ({found}, see its "
                f"experiment.yaml); this {kind} would mix its runs with that one's: pick another --dir"
            )
    check_output_dir(out, "dir")


def write_experiment_record(job: LadderJobConfig, plans: list[SizePlan], exp_dir: Path) -> None:
    exp_dir.mkdir(parents=True, exist_ok=True)
    (exp_dir / "experiment.yaml").write_text(to_yaml(job))
    rows = [{**p.table_row(job), "lr_source": p.lr_source} for p in plans]
    (exp_dir / "plan.json").write_text(json.dumps(rows, indent=2, default=str))


def ladder_trials(job: LadderJobConfig, plans: list[SizePlan]) -> list[TrialSpec]:
    return [
        TrialSpec(
            name=p.size,
            config=ray_run_config(p, job, p.size),
            tags={"ladder": job.name, "size": p.size, "lr_source": p.lr_source},
        )
        for p in costliest_first(plans)
    ]


def run_ladder(job: LadderJobConfig, sizes: list[str] | None, resume: bool, lr_fn=None):
    """Plan and run every size as a Tune trial (after ``preflight``); returns (plans, ResultGrid)."""
    from trainer_core.ray.runtime import init_ray
    from trainer_core.ray.tune_run import TuneSettings, run_trials

    plans = plan_ladder(job, sizes, lr_fn)
    exp_dir = Path(job.dir).resolve()
    write_experiment_record(job, plans, exp_dir)
    init_ray(job.ray.address)
    run = run_trials(ladder_trials(job, plans), exp_dir, TuneSettings(), resume)
    return plans, run.grid


def benchmark_size(job: LadderJobConfig, size: str, steps: int = 20) -> dict:
    """A short run with no checkpoints or evals: tokens/s per device and MFU after warm-up."""
    from trainer_core.ray.runtime import init_ray
    from trainer_core.ray.train_run import run_training

    (plan,) = plan_ladder(job, [size])
    cfg = ray_run_config(plan, job, f"benchmark-{size}")
    data = to_dict(cfg)
    data["trainer"].update(max_steps=steps, log_interval=max(steps // 4, 1), eval_batches=0)
    data["trainer"]["run_dir"] = str(Path(job.dir) / "benchmarks" / f"{size}-{os.getpid()}")
    data["checkpoint"]["enabled"] = False
    data["tracking"]["wandb"] = False
    data["schedule"] = {"kind": "constant", "warmup": 0}
    cfg = from_dict(RayTrainConfig, data)
    init_ray(job.ray.address)
    summary = run_training(cfg)
    return {
        "size": size,
        "devices": plan.devices,
        "tokens_per_s_per_device": summary.get("throughput/tokens_per_s_per_device"),
        "mfu": summary.get("throughput/mfu"),
        "run_dir": cfg.trainer.run_dir,
    }
