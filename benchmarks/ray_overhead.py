"""What a Ray trial costs: the same run by the plain loop and as a one-run Tune trial by each
runner (``ray.runner``: "train", a 1-worker TorchTrainer; "trial", the trial's own process).

Prints each path's steady-state tokens/s (median over steps after the first), its ratio to the
plain loop's, and when the first step was done, in seconds after the trial was launched (the
call that hands it to Tune: the trial's process, Ray Train's processes, imports, data, one
step). Each runner runs ``--ray-runs`` trials in one Tune experiment, one at a time, as a
sweep's trials follow each other in a slot: a later trial is launched when the one before is
done (its last step), and may reuse its process. The first also pays for Ray's cluster-wide
actors.

    python benchmarks/ray_overhead.py [--size 3M] [--steps 60] [--ray-runs 2] [--no-plain]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from trainer_core.config.loader import load_config
from trainer_core.io.run_dir import metrics_path
from trainer_core.ray.run_config import RUNNERS, RayTrainConfig
from trainer_core.ray.runtime import init_ray, submitted_or_local
from trainer_core.ray.tune_run import TrialSpec, TuneSettings, run_trials
from trainer_core.train.build import build_trainer


def records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in metrics_path(run_dir).read_text().splitlines()]


def steady_tokens_per_s(run_dir: Path) -> float:
    rates = [
        r["throughput/tokens_per_s"] for r in records(run_dir) if "throughput/tokens_per_s" in r
    ]
    return statistics.median(rates[1:] or rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--size", default="3M")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ray-runs", type=int, default=2)
    ap.add_argument("--no-plain", action="store_true", help="skip the plain loop")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    try:
        overrides = [
            f"--model.size={args.size}",
            "--data.seq_len=128",
            "--trainer.global_batch_size=2048",
            f"--trainer.max_steps={args.steps}",
            "--trainer.log_interval=1",  # the first record is the first step
            "--trainer.eval_batches=0",
            "--trainer.progress=false",
            "--checkpoint.enabled=false",
            "--ray.cpus_per_worker=1",
        ]
        cfg = load_config(RayTrainConfig, None, overrides)

        def at(run_dir: Path, runner: str) -> RayTrainConfig:
            return replace(
                cfg,
                trainer=replace(cfg.trainer, run_dir=str(run_dir)),
                ray=replace(cfg.ray, runner=runner),
            )

        lines = [f"size {args.size}, {args.steps} steps of {cfg.trainer.global_batch_size} tokens"]
        plain_rate = None
        if not args.no_plain:
            torch.set_num_threads(1)  # a 1-CPU Ray worker gets one thread: compare like with like
            start = time.time()
            build_trainer(at(root / "plain", "train")).fit()
            plain_rate = steady_tokens_per_s(root / "plain")
            first = records(root / "plain")[0]["time"] - start
            lines.append(
                f"  plain loop      : {plain_rate:,.0f} tokens/s steady, first step +{first:.1f} s"
            )

        start = time.perf_counter()
        init_ray(submitted_or_local())  # its own Ray: a shared one would time another's load
        lines.append(f"  ray.init        : {time.perf_counter() - start:.1f} s")
        for runner in [r for r in RUNNERS if r != "auto"]:
            names = [f"{runner}{i}" for i in range(args.ray_runs)]
            specs = [TrialSpec(n, at(root / n, runner)) for n in names]
            launched = time.time()
            run_trials(specs, root / f"exp-{runner}", TuneSettings(max_concurrent=1), False)
            for name in sorted(names, key=lambda n: records(root / n)[0]["time"]):
                recs = records(root / name)
                rate = steady_tokens_per_s(root / name)
                ratio = f", ratio to plain {rate / plain_rate:.3f}" if plain_rate else ""
                lines.append(
                    f"  {runner:5s} {name:7s} : {rate:,.0f} tokens/s steady{ratio}, first step "
                    f"+{recs[0]['time'] - launched:.1f} s after its launch"
                )
                launched = recs[-1]["time"]  # the next trial starts when this one is done
        print("\n".join(lines))
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
