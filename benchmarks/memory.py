"""Peak memory of real train steps against the planner's estimate (trainer_core.memory).

python benchmarks/memory.py [--device cpu|cuda] [--sizes 1M,5M,20M] [--seq-len 512] [--micro 4,8]

Each case runs in a fresh process: the model, AdamW and the train module built the way the
trainer builds them, two steps (optimizer state allocated), then one measured step.
On CUDA the measure is ``torch.cuda.max_memory_allocated``. On CPU it is the process's peak
resident set: ``/proc/self/clear_refs`` resets the kernel's high-water mark (VmHWM) after the
warm-up steps, and the measured step's VmHWM minus the RSS before the model existed is the step's
peak (weights, gradients, AdamW state, activations, logits and the allocator's slack: what a
device would have to hold). Prints estimate, measured and the error per case.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys

CASE = r"""
import json, sys, torch
from trainer_core.config import ModelConfig, OptimConfig, ParallelConfig, ScheduleConfig, TrainModuleConfig
from trainer_core.memory import estimate_memory
from trainer_core.model import Transformer
from trainer_core.optim import build_optimizer
from trainer_core.parallel import parallelize_model
from trainer_core.schedule import build_scheduler
from trainer_core.train_module import TrainModule

size, seq, micro, accum, ac, device = sys.argv[1:7]
seq, micro, accum = int(seq), int(micro), int(accum)
device = torch.device(device)
torch.set_num_threads(2)

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise KeyError(field)

cfg = ModelConfig(size=size, vocab_size=50304)
parallel = ParallelConfig(activation_checkpointing=ac)
module_cfg = TrainModuleConfig(rank_microbatch_seqs=micro)
batch = torch.randint(0, cfg.vocab_size, (micro * accum, seq + 1))
if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats()
before = rss("VmRSS:")
torch.manual_seed(0)
model = parallelize_model(Transformer(cfg, seq), None, parallel, device)
opt = build_optimizer(model, OptimConfig(), device)
module = TrainModule(model, opt, build_scheduler(opt, ScheduleConfig(kind="constant", warmup=0), 9),
                     module_cfg, seq_len=seq, device=device)
for _ in range(2):
    module.train_batch(batch); module.optim_step(); module.zero_grads()
if device.type == "cuda":
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
else:
    open("/proc/self/clear_refs", "w").write("5")
module.train_batch(batch); module.optim_step(); module.zero_grads()
if device.type == "cuda":
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated()
else:
    measured = rss("VmHWM:") - before
est = estimate_memory(cfg, parallel, module_cfg, seq_len=seq, micro_seqs=micro, dp_shard=1, grad_accum=accum)
print(json.dumps({"measured": measured, "estimate": est.total,
                  "states": est.params + est.grads + est.optimizer,
                  "activations": est.activations, "logits": est.logits}))
"""


def run_case(size: str, seq: int, micro: int, accum: int, ac: str, device: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CASE, size, str(seq), str(micro), str(accum), ac, device],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sizes", default="1M,5M,20M")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro", default="4,8", help="micro-batch sequences to try")
    ap.add_argument("--accum", type=int, default=2)
    args = ap.parse_args()
    mib = 2**20
    print(f"peak memory per step, {args.device}, seq {args.seq_len}, accumulation {args.accum}")
    print(
        f"{'size':>5} {'micro':>5} {'AC':>5} {'states':>8} {'activ.':>8} {'logits':>8} "
        f"{'estimate':>9} {'measured':>9} {'error':>7}   (MiB)"
    )
    worst = 0.0
    cases = itertools.product(
        args.sizes.split(","), map(int, args.micro.split(",")), ["none", "full"]
    )
    for size, micro, ac in cases:
        r = run_case(size, args.seq_len, micro, args.accum, ac, args.device)
        error = r["estimate"] / r["measured"] - 1
        worst = max(worst, abs(error))
        print(
            f"{size:>5} {micro:>5} {ac:>5} {r['states'] / mib:8.1f} {r['activations'] / mib:8.1f} "
            f"{r['logits'] / mib:8.1f} {r['estimate'] / mib:9.1f} {r['measured'] / mib:9.1f} "
            f"{100 * error:+6.1f}%"
        )
    print(f"largest error {100 * worst:.1f}% (target: within 25%)")


if __name__ == "__main__":
    main()
