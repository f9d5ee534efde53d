"""What Ray Train costs: the same run by the plain loop and by a 1-worker TorchTrainer.

Prints each path's steady-state tokens/s (median over log windows after the first), their ratio
and start-up time (wall time not explained by steady-state training). Ray runs ``--ray-runs``
times in one Ray, as a sweep's trials do: the first also pays for Ray's cluster-wide actors, the
later ones are what each further trial costs. Each Ray run's rank 0 prints a ``[startup]`` line:
when it reached each stage, in seconds after the driver called ``fit``.

    python benchmarks/ray_overhead.py [--size 3M] [--steps 60] [--ray-runs 2] [--no-plain]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from trainer_core.config.loader import load_config
from trainer_core.io.run_dir import metrics_path
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.ray.runtime import init_ray
from trainer_core.ray.train_driver import run_training
from trainer_core.train.build import build_trainer


def steady_tokens_per_s(run_dir: Path) -> float:
    lines = [json.loads(x) for x in metrics_path(run_dir).read_text().splitlines()]
    rates = [r["throughput/tokens_per_s"] for r in lines if "throughput/tokens_per_s" in r]
    return statistics.median(rates[1:] or rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--size", default="3M")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ray-runs", type=int, default=2)
    ap.add_argument("--no-plain", action="store_true", help="skip the plain loop")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    overrides = [
        f"--model.size={args.size}",
        "--data.seq_len=128",
        "--trainer.global_batch_size=2048",
        f"--trainer.max_steps={args.steps}",
        f"--trainer.log_interval={max(args.steps // 6, 1)}",
        "--trainer.eval_batches=0",
        "--trainer.progress=false",
        "--checkpoint.enabled=false",
        "--ray.cpus_per_worker=1",
    ]
    cfg = load_config(RayTrainConfig, None, overrides)
    tokens = args.steps * cfg.trainer.global_batch_size

    def at(run_dir: Path) -> RayTrainConfig:
        return replace(cfg, trainer=replace(cfg.trainer, run_dir=str(run_dir)))

    lines = [f"size {args.size}, {args.steps} steps of {cfg.trainer.global_batch_size} tokens"]
    plain_rate = None
    if not args.no_plain:
        torch.set_num_threads(1)  # a 1-CPU Ray worker gets one thread: compare like with like
        start = time.perf_counter()
        build_trainer(at(root / "plain")).fit()
        plain_wall = time.perf_counter() - start
        plain_rate = steady_tokens_per_s(root / "plain")
        lines.append(
            f"  plain loop : {plain_rate:,.0f} tokens/s steady, "
            f"start-up {plain_wall - tokens / plain_rate:.1f} s"
        )

    start = time.perf_counter()
    init_ray()
    lines.append(f"  ray.init   : {time.perf_counter() - start:.1f} s")
    for i in range(args.ray_runs):
        start = time.perf_counter()
        run_training(at(root / f"ray{i}"))
        wall = time.perf_counter() - start
        rate = steady_tokens_per_s(root / f"ray{i}")
        ratio = f", steady ratio Ray / plain {rate / plain_rate:.3f}" if plain_rate else ""
        lines.append(
            f"  Ray run {i}  : {rate:,.0f} tokens/s steady, "
            f"start-up {wall - tokens / rate:.1f} s{ratio}"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
