"""Train-step throughput on one device: tokens/s, MFU and peak memory (median after warm-up),
of the bare step and of the real Trainer loop.

python benchmarks/train_step.py --size 1M [--seq-len 128] [--batch-seqs 16] [--micro-seqs 0]
    [--steps 12] [--vocab-size 320] [--precision fp32|bf16] [--compile]
    [--float8 none|tensorwise|rowwise] [--attention auto|flash|cudnn|efficient|math]
    [--activation-checkpointing none|full|every_k] [--bare-only] [--one-rank-fsdp] [--profile]
    [--json]

The model is built and wrapped the way the trainer builds it (parallelize_model: float8, compile;
fused AdamW on CUDA; bf16 from trainer_core.parallel.precision, i.e. autocast on one device). MFU is
FLOPs/token (6N + 12 L d s) x tokens/s over the device's peak (trainer_core.devices); peak memory
(CUDA only) is set beside the planner's estimate (trainer_core.ladder.memory). One more step runs
under the profiler to name the attention kernel that ran; ``--profile`` profiles two more and
splits their time by kernel family (matmuls, attention, compiled fused kernels, optimizer,
other: on a GPU each kernel's device time, on a CPU each op's own time), to show where a step
below its MFU target loses it. Then the same run goes through the
real :class:`Trainer` loop (demo-corpus batches, device-side metrics read on log steps, the
checkpoint decision every step, no save): its tokens/s and MFU over ``--steps`` steps after as
many warm-up steps, as the loop's own log line measures them, so the gap between the bare step
and the loop is visible. ``--json`` prints the result as one JSON line (benchmarks/gpu_check.py
reads it).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import get_args, get_type_hints

import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.distributed.device_mesh import DeviceMesh
from torch.profiler import ProfilerActivity, profile

from trainer_core.config.cli import exit_on_error
from trainer_core.config.sections import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    ParallelConfig,
    ScheduleConfig,
    TrainConfig,
    TrainerConfig,
    TrainModuleConfig,
)
from trainer_core.devices import peak_flops
from trainer_core.ladder.memory import estimate_memory
from trainer_core.model.attention import attention_backends_run
from trainer_core.model.counts import count_params, num_flops_per_token
from trainer_core.parallel.wrap import build_mesh
from trainer_core.train.build import build_train_module, build_trainer
from trainer_core.train.callbacks import BaseCallback
from trainer_core.train.train_module import TrainModule

PARAM_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
KERNEL_FAMILIES = (
    ("attention", ("flash", "fmha", "scaled_dot_product", "sdpa", "attention")),
    ("optimizer", ("adam", "multi_tensor_apply", "_foreach_")),
    ("matmuls", ("gemm", "nvjet", "cutlass", "xmma", "aten::mm", "aten::addmm", "aten::bmm")),
    ("fused (compiled)", ("triton_", "compiledfxgraph")),
)
"""Families of kernels (GPU) or ops (CPU) by substrings of their names, first match wins:
cuDNN's attention kernels name a gemm too; compile's fused kernels are Triton's on a GPU, and
on a CPU the own time of each call of a compiled graph (its matmuls stay ``aten::mm``)."""
PROFILED_STEPS = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--size", default="1M")
    ap.add_argument("--vocab-size", type=int, default=ModelConfig.vocab_size)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-seqs", type=int, default=16, help="sequences per optimizer step")
    ap.add_argument("--micro-seqs", type=int, default=0, help="sequences per forward; 0 = all")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", choices=list(PARAM_DTYPES), default="fp32")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument(
        "--activation-checkpointing",
        choices=_choices(ParallelConfig, "activation_checkpointing"),
        default="none",
    )
    ap.add_argument("--float8", choices=_choices(ParallelConfig, "float8"), default="none")
    ap.add_argument("--float8-emulate", action="store_true", help="no GPU needed, no speed-up")
    ap.add_argument(
        "--attention", choices=_choices(ModelConfig, "attention_backend"), default="auto"
    )
    ap.add_argument(
        "--bare-only", action="store_true", help="skip the Trainer loop (a quicker tuning sweep)"
    )
    ap.add_argument(
        "--one-rank-fsdp",
        action="store_true",
        help="wrap the one device in FSDP2 (bf16 from its policy, not autocast); bare step only",
    )
    ap.add_argument(
        "--profile", action="store_true", help="time by kernel family over two more steps"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    return ap.parse_args(argv)


def _choices(cls: type, name: str) -> list[str]:
    """The values a ``Literal`` config field allows."""
    return list(get_args(get_type_hints(cls)[name]))


def run_config(args: argparse.Namespace) -> TrainConfig:
    """The run the arguments describe: constant LR, the given batch and micro-batch."""
    cfg = ModelConfig(size=args.size, vocab_size=args.vocab_size, attention_backend=args.attention)
    parallel = ParallelConfig(
        param_dtype=PARAM_DTYPES[args.precision],
        compile=args.compile,
        activation_checkpointing=args.activation_checkpointing,
        float8=args.float8,
        float8_emulate=args.float8_emulate,
    )
    return TrainConfig(
        model=cfg,
        parallel=parallel,
        train_module=TrainModuleConfig(rank_microbatch_seqs=args.micro_seqs),
        schedule=ScheduleConfig(kind="constant", warmup=0),
        data=DataConfig(seq_len=args.seq_len),
        trainer=TrainerConfig(
            global_batch_size=args.batch_seqs * args.seq_len,
            max_steps=args.steps + args.warmup + 1,
            device=torch.device(args.device).type,
        ),
    )


def measure(args: argparse.Namespace) -> dict:
    """The bare step's figures, then the Trainer loop's, one model in memory at a time."""
    run = run_config(args)
    bare = measure_step(run, args)
    if args.bare_only or args.one_rank_fsdp:
        return bare
    gc.collect()
    if torch.device(args.device).type == "cuda":
        torch.cuda.empty_cache()
    return {**bare, **measure_loop(run, args.steps)}


def measure_step(run: TrainConfig, args: argparse.Namespace) -> dict:
    """Build the model as configured, time ``args.steps`` optimizer steps, return the figures."""
    device = torch.device(args.device)
    cfg, parallel = run.model, run.parallel
    mesh = one_rank_mesh(parallel, device) if args.one_rank_fsdp else None
    module = build_train_module(run, device, mesh, dp_size=1)
    batch = torch.randint(0, cfg.vocab_size, (args.batch_seqs, args.seq_len + 1))

    def step() -> None:
        module.train_batch(batch)
        module.optim_step()
        module.zero_grads()

    times = []
    for i in range(args.warmup + args.steps):
        if i == args.warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    peak_memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    attention = sorted(attention_backends_run(step))
    step_s = statistics.median(times)
    tokens_per_s = args.batch_seqs * args.seq_len / step_s
    flops_per_token = num_flops_per_token(cfg, args.seq_len)
    peak = peak_flops(device)
    micro = args.micro_seqs or args.batch_seqs
    estimate = estimate_memory(
        cfg,
        parallel,
        run.train_module,
        seq_len=args.seq_len,
        micro_seqs=micro,
        dp_shard=1,
        grad_accum=args.batch_seqs // micro,
    )
    result = {
        "size": args.size,
        "non_embedding_params": count_params(cfg)["non_embedding"],
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": args.precision,
        "compile": args.compile,
        "activation_checkpointing": parallel.activation_checkpointing,
        "float8": parallel.float8,
        "bf16_from": bf16_source(module),
        "batch": f"{args.batch_seqs}x{args.seq_len} (micro {micro})",
        "step_ms": 1000 * step_s,
        "tokens_per_s": tokens_per_s,
        "mfu": flops_per_token * tokens_per_s / peak,
        "peak_flops": peak,
        "peak_memory_bytes": peak_memory,
        "estimated_memory_bytes": estimate.total,
        "attention": attention,
    }
    if args.profile:
        result["profile"] = time_by_family(step, device)
    return result


def kernel_family(name: str) -> str:
    """The :data:`KERNEL_FAMILIES` entry a kernel or op belongs to, else "other"."""
    low = name.lower()
    return next((fam for fam, keys in KERNEL_FAMILIES if any(k in low for k in keys)), "other")


def time_by_family(step: Callable[[], None], device: torch.device) -> dict:
    """Milliseconds per step by kernel family over :data:`PROFILED_STEPS` steps, beside the
    profiled steps' wall time: on CUDA each kernel's device time, elsewhere each op's own
    (self) time; the profiler's annotations (``Optimizer.step``, compiled regions) are spans
    over other work, not counted."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    _sync(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        _sync(device)
    wall_ms = 1000 * (time.perf_counter() - start) / PROFILED_STEPS
    families: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if getattr(event, "is_user_annotation", False):
            continue
        if device.type == "cuda":
            if event.device_type != DeviceType.CUDA:
                continue
            us = event.device_time
            family = kernel_family(event.name)
        else:
            us = event.self_cpu_time_total
            family = "optimizer" if _under_optimizer(event) else kernel_family(event.name)
        families[family] += us / 1000 / PROFILED_STEPS
    return {"wall_ms": wall_ms, "families_ms": dict(families)}


def _under_optimizer(event) -> bool:
    """Whether a CPU op ran inside the optimizer's step (its plain ops, e.g. ``aten::lerp_``,
    name no optimizer)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer.step"):
            return True
        parent = parent.cpu_parent
    return False


def one_rank_mesh(parallel: ParallelConfig, device: torch.device) -> DeviceMesh:
    """A process group and mesh of this one process, for FSDP2 on a single device."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return build_mesh(parallel, 1, device.type, one_rank=True)


def bf16_source(module: TrainModule) -> str:
    """Where the step's 16-bit compute comes from, read off the built module."""
    from torch.distributed.fsdp import FSDPModule

    if module.autocast_dtype is not None:
        return "autocast"
    return "FSDP2 policy" if isinstance(module.model, FSDPModule) else "none"


class _LastLog(BaseCallback):
    """Keeps the last log line's metrics."""

    def __init__(self):
        self.metrics: dict[str, float] = {}

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        self.metrics = metrics


def measure_loop(run: TrainConfig, steps: int) -> dict:
    """``2 * steps`` steps of the real loop, logging every ``steps``: the second line's
    throughput (training time alone, as every log line counts it) is the loop's figure."""
    with tempfile.TemporaryDirectory(prefix="train-step-") as tmp:
        loop = replace(
            run,
            trainer=replace(
                run.trainer,
                run_dir=tmp,
                max_steps=2 * steps,
                log_interval=steps,
                eval_interval=2 * steps,
                eval_batches=0,
                progress=False,
            ),
            checkpoint=CheckpointConfig(save_interval_minutes=1e9, save_final=False),
        )
        last = _LastLog()
        build_trainer(loop, extra_callbacks=[last]).fit()
    return {
        "loop_tokens_per_s": last.metrics["throughput/tokens_per_s"],
        "loop_mfu": last.metrics["throughput/mfu"],
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summary_line(r: dict) -> str:
    gib = 2**30
    measured = f"{r['peak_memory_bytes'] / gib:.1f} GiB" if r["peak_memory_bytes"] else "n/a"
    return (
        f"size {r['size']} ({r['non_embedding_params']:,} non-embedding params) on {r['device']}, "
        f"{r['precision']} ({r['bf16_from']}), compile {'on' if r['compile'] else 'off'}, "
        f"AC {r['activation_checkpointing']}, float8 {r['float8']}, "
        f"batch {r['batch']}: median step {r['step_ms']:.1f} ms, {r['tokens_per_s']:,.0f} "
        f"tokens/s, MFU {100 * r['mfu']:.1f}% of {r['peak_flops'] / 1e12:.3g} TFLOP/s, peak memory "
        f"{measured} (estimate {r['estimated_memory_bytes'] / gib:.1f} GiB), attention "
        f"{','.join(r['attention']) or 'inlined by compile'}"
        + (
            f"; Trainer loop {r['loop_tokens_per_s']:,.0f} tokens/s, MFU {100 * r['loop_mfu']:.1f}%"
            if "loop_tokens_per_s" in r
            else ""
        )
        + (profile_line(r["profile"]) if "profile" in r else "")
    )


def profile_line(profile: dict) -> str:
    """``--profile``'s figures as a line of their own, largest family first."""
    wall = profile["wall_ms"]
    ranked = sorted(profile["families_ms"].items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{fam} {ms:.1f} ({100 * ms / wall:.1f}%)" for fam, ms in ranked)
    return f"\ntime by kernel family, ms per step of {wall:.1f} ms profiled: {parts}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = measure(args)
    print(json.dumps(result) if args.json else summary_line(result))
    return 0


if __name__ == "__main__":
    exit_on_error(main)
