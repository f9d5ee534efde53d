"""Train-step throughput: tokens/s and MFU for a model size and batch (median after warm-up).

python benchmarks/train_step.py --size 1M [--seq-len 128] [--batch-seqs 16] [--steps 12]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trainer_core.config import ModelConfig, OptimConfig, ScheduleConfig, TrainModuleConfig
from trainer_core.flops import peak_flops
from trainer_core.model import Transformer, count_params, num_flops_per_token
from trainer_core.optim import build_optimizer
from trainer_core.schedule import build_scheduler
from trainer_core.train_module import TrainModule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--size", default="1M")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-seqs", type=int, default=16)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--autocast", choices=["bf16", "fp16"], default=None)
    args = ap.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = ModelConfig(size=args.size)
    model = Transformer(cfg, args.seq_len).to(device)
    opt = build_optimizer(model, OptimConfig(), device)
    sched = build_scheduler(
        opt, ScheduleConfig(kind="constant", warmup=0), args.steps + args.warmup
    )
    module = TrainModule(
        model,
        opt,
        sched,
        TrainModuleConfig(autocast_precision=args.autocast),
        seq_len=args.seq_len,
        device=device,
    )
    batch = torch.randint(0, cfg.vocab_size, (args.batch_seqs, args.seq_len + 1))
    times = []
    for i in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        module.train_batch(batch)
        module.optim_step()
        module.zero_grads()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    tokens_per_s = args.batch_seqs * args.seq_len / step_s
    flops = num_flops_per_token(cfg, args.seq_len) * tokens_per_s
    peak = peak_flops(device)
    print(
        f"size {args.size} ({count_params(cfg)['non_embedding']:,} non-embedding params), "
        f"batch {args.batch_seqs}x{args.seq_len} on {device.type} ({torch.get_num_threads()} threads): "
        f"median step {1000 * step_s:.1f} ms, {tokens_per_s:,.0f} tokens/s, "
        f"{flops / 1e9:.1f} GFLOP/s, MFU {100 * flops / peak:.1f}% of {peak / 1e9:.0f} GFLOP/s peak"
    )


if __name__ == "__main__":
    main()
