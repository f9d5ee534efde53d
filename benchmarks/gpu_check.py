"""``make gpu-check``: the GPU path end to end on one CUDA machine, in one command.

python benchmarks/gpu_check.py [--parts tests,bench,ladder]

1. tests: the tests marked ``cuda`` (tests/cuda/): bf16 vs fp32 over 50 steps, compile vs eager,
   float8 vs bf16, the attention backend that ran, checkpoint save and resume on the GPU.
2. bench: benchmarks/train_step.py at OLMo-core's 1B dims (d_model 2048, 16 layers, seq 4096,
   vocabulary 100,352), compile on, bf16 then float8 (tensorwise, rowwise): tokens/s per GPU,
   MFU, peak memory beside the planner's estimate, and the targets (60k tokens/s in bf16, 70k
   with float8; OLMo-core reaches about 55k and 65k on an H100) as PASS/FAIL.
3. ladder: a two-size ladder of tiny models through Ray Tune and Train on the GPU
   (``use_gpu`` planned from ``device_type``), each run finished on CUDA.

Prints a summary table and exits 1 if any check failed; on a machine without CUDA it says so in
one line and exits 1. Everything it writes goes to a temp dir, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch
import yaml

from trainer_core.config.cli import exit_on_error
from trainer_core.data.demo_corpus import CACHE_ENV
from trainer_core.devices import device_key

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tests", "bench", "ladder")
OLMO_1B = (
    *("--size", "1B", "--vocab-size", "100352", "--seq-len", "4096"),
    *("--batch-seqs", "8", "--micro-seqs", "2", "--steps", "10", "--warmup", "3"),
    *("--precision", "bf16", "--compile"),
)
"""OLMo-core's 1B (its vocabulary padded to a multiple of 128), 32k tokens a step in micro-batches
of two sequences: accumulation keeps the optimizer step a small part of the time, as in a run."""
TARGETS = {"none": 60_000, "tensorwise": 70_000, "rowwise": 70_000}
"""Tokens/s per H100 to reach, by float8 recipe ("none": bf16)."""
UNPLANNED_GPU = "A100"
"""The ``device_type`` the tiny ladder plans with on a GPU missing from the FLOPs table (tiny
models fit any GPU; the table's A100 is also MFU's guess for an unknown GPU)."""


class Check(NamedTuple):
    name: str
    passed: bool
    detail: str


def cuda_tests(env: dict[str, str]) -> Check:
    """The tests marked cuda, their output streamed as they run."""
    argv = ["-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests/cuda"]
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env)
    return Check("tests marked cuda", proc.returncode == 0, f"pytest exit code {proc.returncode}")


def benchmark(float8: str, env: dict[str, str], args: tuple[str, ...] = OLMO_1B) -> Check:
    """One train-step benchmark in a fresh process: its own peak memory, and an out-of-memory
    ends only this case."""
    name = "train step bf16" + ("" if float8 == "none" else f" + float8 {float8}")
    argv = ["benchmarks/train_step.py", *args, "--float8", float8, "--json"]
    proc = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        return Check(name, False, _last_line(proc.stderr))
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    gib = 2**30
    peak = r["peak_memory_bytes"]
    target = TARGETS[float8]
    detail = (
        f"{r['tokens_per_s']:,.0f} tokens/s per GPU (target {target:,}), MFU "
        f"{100 * r['mfu']:.1f}%, peak memory "
        f"{'n/a' if peak is None else f'{peak / gib:.1f} GiB'} (estimate "
        f"{r['estimated_memory_bytes'] / gib:.1f} GiB), attention "
        f"{','.join(r['attention']) or 'inlined by compile'}, {r['device']}"
    )
    return Check(name, r["tokens_per_s"] >= target, detail)


def ladder_config(exp_dir: Path, device_type: str) -> dict:
    """1M and 3M on 64-token sequences for 1/1024 of their Chinchilla tokens, one GPU each."""
    return {
        "name": "gpu-check",
        "dir": str(exp_dir),
        "sizes": ["1M", "3M"],
        "max_devices": 1,
        "device_type": device_type,
        "seq_len": 64,
        "batch": {"coef": 20480.0},
        "duration": {"chinchilla_multiple": 2**-10},
        "run": {
            "trainer": {"eval_batches": 2, "log_interval": 5},
            "checkpoint": {"save_interval_minutes": None},
        },
        "ray": {"address": "local"},
    }


def tiny_ladder(tmp: Path, env: dict[str, str], device_type: str) -> Check:
    """The ladder workflow as a user runs it; passes when both runs finished on CUDA."""
    config = tmp / "ladder.yaml"
    config.write_text(yaml.safe_dump(ladder_config(tmp / "ladder", device_type)))
    proc = subprocess.run(
        [sys.executable, "workflows/ladder.py", "--config", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    runs = {}
    for info in sorted((tmp / "ladder" / "runs").glob("*/run.json")):
        run_cfg = yaml.safe_load((info.parent / "config.yaml").read_text())
        runs[info.parent.name] = (
            json.loads(info.read_text())["status"],
            run_cfg["trainer"]["device"],
        )
    passed = (
        proc.returncode == 0
        and len(runs) == 2
        and all(run == ("finished", "cuda") for run in runs.values())
    )
    detail = ", ".join(f"{name}: {status} on {dev}" for name, (status, dev) in runs.items())
    if proc.returncode != 0:
        detail = f"exit code {proc.returncode}: {_last_line(proc.stderr)}"
    return Check(f"tiny ladder on Ray ({device_type})", passed, detail or "no runs")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def summary(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    rows = [f"{'check':<{width}}  result  detail"]
    rows += [f"{c.name:<{width}}  {'PASS' if c.passed else 'FAIL':<6}  {c.detail}" for c in checks]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"some of {', '.join(PARTS)}")
    parts = ap.parse_args(argv).parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); "
            "run make gpu-check on a GPU machine",
            file=sys.stderr,
        )
        return 1
    name = torch.cuda.get_device_name()
    print(f"gpu-check on {name}, torch {torch.__version__}", flush=True)
    checks: list[Check] = []

    def record(check: Check) -> None:
        checks.append(check)
        print(f"{'PASS' if check.passed else 'FAIL'} {check.name}: {check.detail}", flush=True)

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        env = {**os.environ, CACHE_ENV: str(Path(tmp) / "cache"), "PYTHONDONTWRITEBYTECODE": "1"}
        if "tests" in parts:
            record(cuda_tests(env))
        if "bench" in parts:
            for float8 in TARGETS:
                record(benchmark(float8, env))
        if "ladder" in parts:
            record(tiny_ladder(Path(tmp), env, device_key(name) or UNPLANNED_GPU))
    print(summary(checks))
    return 0 if all(c.passed for c in checks) else 1


if __name__ == "__main__":
    exit_on_error(main)
