"""Peak memory of real train steps against the planner's estimate (trainer_core.ladder.memory).

python benchmarks/memory.py [--device cpu|cuda] [--cases logits,fsdp2,...]

Each case runs in fresh processes (two gloo ranks for the FSDP2 cases; NCCL on two GPUs): the
model, AdamW and the train module built the way the trainer builds them (mesh, FSDP2, the
autocast rule of :mod:`trainer_core.parallel.precision`), one step (optimizer state allocated), then one
measured step. The measure is what the allocator holds at the step's peak. On CUDA that is
``torch.cuda.max_memory_allocated``. On CPU torch has no allocator statistics, but c10's CPU
allocator reports every allocation and free to ``torch.profiler`` under ``profile_memory=True``:
profiling from before the model exists, the running sum of those events is the bytes live, and
its maximum inside the measured step is the same quantity. The process's peak resident set
(VmHWM, reset after the warm-up step, minus the RSS before the model) is printed beside it:
allocator bytes plus malloc's slack and what lives outside tensors. With two ranks, the larger
rank's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass, replace
from subprocess import PIPE, Popen

import torch


@dataclass(frozen=True)
class Case:
    """One measured configuration (per-rank micro-batch and accumulation)."""

    name: str
    size: str
    vocab: int
    seq: int
    micro: int
    accum: int = 2
    ac: str = "none"
    autocast: str | None = None
    param_dtype: str = "float32"
    ranks: int = 1
    reduce_every_micro_batch: bool = False
    z_loss: float | None = None
    compile: bool = False


LOGITS = Case("logits", "5M", 50304, 512, 2)
"""A 50k vocabulary on short sequences: the logits and their loss intermediates dominate."""
ACTIVATIONS = Case("activ.", "1M", 320, 512, 4)
"""A byte-level vocabulary, 4 x 512 tokens a micro-batch: the blocks' saved activations dominate."""
FSDP = Case("fsdp2", "20M", 320, 256, 2, ranks=2)
"""Two ranks accumulating over two micro-batches: FSDP's unsharded gradients are live (and, with
a 50k vocabulary, the gathered embedding and LM head)."""

GRID = [
    Case("grid", size, 8192, 512, micro, ac=ac)
    for size in ("1M", "5M", "20M")
    for micro in (2, 4)
    for ac in ("none", "full")
]
"""Three sizes x two micro-batches x activation checkpointing off / on, a 8k vocabulary: the
shape of a ladder's plan, where the size and the micro-batch move and the other settings stay."""

CASES = [
    *GRID,
    LOGITS,
    replace(LOGITS, ac="full"),
    replace(LOGITS, name="logits-z", z_loss=1e-4),
    replace(LOGITS, name="logits-bf16", autocast="bf16"),
    ACTIVATIONS,
    replace(ACTIVATIONS, ac="full"),
    replace(ACTIVATIONS, name="activ.-bf16", autocast="bf16"),
    replace(LOGITS, name="logits-c", compile=True),
    replace(LOGITS, name="logits-c-z", compile=True, z_loss=1e-4),
    replace(LOGITS, name="logits-c-bf16", compile=True, autocast="bf16"),
    replace(ACTIVATIONS, name="activ.-c", compile=True),
    replace(ACTIVATIONS, name="activ.-c", compile=True, ac="full"),
    replace(ACTIVATIONS, name="activ.-c-bf16", compile=True, autocast="bf16"),
    # compiled under bf16 autocast with AC (the GPU's one-device setting): full, every 2nd
    # block, and full with one micro-batch (no gradients at the loss's peak)
    replace(LOGITS, name="logits-c-ac", compile=True, autocast="bf16", ac="full"),
    replace(LOGITS, name="logits-c-ac", compile=True, autocast="bf16", ac="every_k"),
    replace(LOGITS, name="logits-c-ac", compile=True, autocast="bf16", ac="full", micro=4, accum=1),
    replace(ACTIVATIONS, name="activ.-c-ac", compile=True, autocast="bf16", ac="full"),
    replace(ACTIVATIONS, name="activ.-c-ac", compile=True, autocast="bf16", ac="every_k"),
    replace(
        ACTIVATIONS, name="activ.-c-ac", compile=True, autocast="bf16", ac="full", micro=8, accum=1
    ),
    FSDP,
    replace(FSDP, name="fsdp2-every", reduce_every_micro_batch=True),
    replace(FSDP, name="fsdp2-bf16", param_dtype="bfloat16"),
    replace(FSDP, name="fsdp2-c-bf16", param_dtype="bfloat16", compile=True),
    replace(LOGITS, name="fsdp2-vocab", seq=256, ranks=2, reduce_every_micro_batch=True),
]


def rss(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def allocator_peak(prof: torch.profiler.profile, window: str) -> int:
    """The most bytes live during the ``record_function(window)`` region, from the profiler's
    allocation (+) and free (-) events since profiling began."""
    events = prof.profiler.kineto_results.events()
    (region,) = [(e.start_ns(), e.end_ns()) for e in events if e.name() == window]
    live = peak = 0
    for start, nbytes in sorted(
        (e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"
    ):
        if start > region[1]:
            break
        live += nbytes
        if start >= region[0]:
            peak = max(peak, live)
    return peak


def measure(case: Case, device_type: str) -> dict:
    """One rank of ``case``: build as the trainer does, warm up, measure one step."""
    from trainer_core.config.sections import (
        DataConfig,
        ModelConfig,
        ParallelConfig,
        ScheduleConfig,
        TrainConfig,
        TrainerConfig,
        TrainModuleConfig,
    )
    from trainer_core.ladder.memory import estimate_memory
    from trainer_core.parallel.process_group import init_distributed, teardown
    from trainer_core.parallel.wrap import build_mesh
    from trainer_core.train.build import build_train_module

    torch.set_num_threads(max(1, 2 // case.ranks))
    info = init_distributed(device_type)
    device = info.device
    cfg = ModelConfig(size=case.size, vocab_size=case.vocab)
    parallel = ParallelConfig(
        activation_checkpointing=case.ac, param_dtype=case.param_dtype, compile=case.compile
    )
    module_cfg = TrainModuleConfig(
        rank_microbatch_seqs=case.micro,
        autocast_precision=case.autocast,
        reduce_grads_every_micro_batch=case.reduce_every_micro_batch,
        z_loss_multiplier=case.z_loss,
    )
    batch = torch.randint(0, cfg.vocab_size, (case.micro * case.accum, case.seq + 1))
    run = TrainConfig(
        model=cfg,
        parallel=parallel,
        train_module=module_cfg,
        schedule=ScheduleConfig(kind="constant", warmup=0),
        data=DataConfig(seq_len=case.seq),
        trainer=TrainerConfig(
            global_batch_size=len(batch) * case.seq * info.world_size, max_steps=9
        ),
    )
    cuda = device.type == "cuda"
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    )
    before = rss("VmRSS:")
    with profiler:
        mesh = build_mesh(parallel, info.world_size, device.type)
        module = build_train_module(run, device, mesh, dp_size=info.world_size)
        for step in range(2):
            if step == 1:
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                with open("/proc/self/clear_refs", "w") as refs:
                    refs.write("5")  # VmHWM := VmRSS
            with torch.profiler.record_function(f"step {step}"):
                module.train_batch(batch)
                module.optim_step()
                module.zero_grads()
    if cuda:
        torch.cuda.synchronize()
        allocated = torch.cuda.max_memory_allocated()
    else:
        allocated = allocator_peak(profiler, "step 1")
    est = estimate_memory(
        cfg,
        parallel,
        module_cfg,
        seq_len=case.seq,
        micro_seqs=case.micro,
        dp_shard=info.world_size,
        grad_accum=case.accum,
    )
    teardown()
    return {
        "allocated": allocated,
        "rss": rss("VmHWM:") - before,
        "estimate": est.total,
        "states": est.params + est.grads + est.optimizer,
        "fsdp": est.unsharded_grads + est.gathered_params,
        "activations": est.activations,
        "logits": est.logits,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(case: Case, device: str) -> dict:
    """``case`` in ``case.ranks`` fresh processes; the figures of the rank that held most."""
    port = free_port()
    procs = []
    for rank in range(case.ranks):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(case.ranks),
        }
        cmd = [sys.executable, __file__, "--device", device, "--measure", json.dumps(asdict(case))]
        procs.append(Popen(cmd, env=env, stdout=PIPE, stderr=PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"case {case.name}: a rank exited with {proc.returncode}\n{err}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return max(results, key=lambda r: r["allocated"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--cases",
        default=",".join(dict.fromkeys(c.name for c in CASES)),
        help="case names to run (a name covers its AC variants)",
    )
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        from trainer_core.parallel.process_group import exit_rank

        print(json.dumps(measure(Case(**json.loads(args.measure)), args.device)))
        exit_rank(0)
    names = set(args.cases.split(","))
    mib = 2**20
    print(f"peak memory per step and device, {args.device} (allocator bytes; RSS beside it)")
    print(
        f"{'case':>12} {'size':>4} {'vocab':>5} {'seq':>4} {'micro':>5} {'accum':>5} {'AC':>7} "
        f"{'ranks':>5} {'states':>7} {'FSDP':>7} {'activ.':>7} {'logits':>7} {'estimate':>8} "
        f"{'measured':>8} {'RSS':>7} {'error':>7}   (MiB)"
    )
    worst = 0.0
    for case in (c for c in CASES if c.name in names):
        if args.device == "cuda" and torch.cuda.device_count() < case.ranks:
            print(f"{case.name:>12} skipped: needs {case.ranks} GPUs", flush=True)
            continue
        r = run_case(case, args.device)
        error = r["estimate"] / r["allocated"] - 1
        worst = max(worst, abs(error))
        print(
            f"{case.name:>12} {case.size:>4} {case.vocab:>5} {case.seq:>4} {case.micro:>5} "
            f"{case.accum:>5} {case.ac:>7} {case.ranks:>5} {r['states'] / mib:7.1f} "
            f"{r['fsdp'] / mib:7.1f} {r['activations'] / mib:7.1f} {r['logits'] / mib:7.1f} "
            f"{r['estimate'] / mib:8.1f} {r['allocated'] / mib:8.1f} {r['rss'] / mib:7.1f} "
            f"{100 * error:+6.1f}%",
            flush=True,
        )
    print(f"largest error {100 * worst:.1f}% (target: within 25%)")


if __name__ == "__main__":
    main()
