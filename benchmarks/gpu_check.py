"""``make gpu-check``: the GPU path end to end on one CUDA machine, in one command.

python benchmarks/gpu_check.py [--parts tests,bench,ladder] [--wheels .gpu-wheels]

On a bare GPU machine (its own ``python3`` with CUDA torch, no network, no ``make setup``), one
part per command, each well under 10 minutes::

    make gpu-wheels                      # here: torchao, zstandard, draccus, ... into .gpu-wheels/
    PYTHONPATH=. python3 benchmarks/gpu_check.py --parts tests    # there, .gpu-wheels carried

The carried wheels are installed into ``.gpu-wheels/site`` (no index, no network) for the
packages this Python lacks, and put on the path of every process the check starts. A part whose
packages are still missing says which, and why, in one line, and is not run. Ray's wheel is
larger than the 64 MiB a GPU machine is sent, so it travels trimmed and recompressed
(``ray-*.tar.xz``, benchmarks/pack_ray.py) and is unpacked into the same site folder.

1. tests: the tests marked ``cuda`` (tests/cuda/): bf16 vs fp32 over 50 steps, compile vs eager,
   float8 vs bf16, the attention backend that ran, checkpoint save and resume on the GPU.
2. bench: benchmarks/train_step.py (the bare step and the real Trainer loop) at OLMo-core's 1B dims (d_model 2048, 16 layers, seq 4096,
   vocabulary 100,352), compile on, bf16 then float8 (tensorwise, rowwise): tokens/s per GPU,
   MFU, peak memory beside the planner's estimate, the step's time by kernel family, and the
   targets (:data:`TARGETS`) as PASS/FAIL.
3. ladder: a two-size ladder of tiny models through Ray Tune and Train on the GPU
   (``use_gpu`` planned from ``device_type``), each run finished on CUDA.

Prints a summary table and exits 1 if any check failed; on a machine without CUDA it says so in
one line and exits 1. Everything it writes goes to a temp dir, removed at the end.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tests", "bench", "ladder")
NEEDS = {
    "tests": (
        "pytest",
        "pytest_timeout",
        "zstandard",
        "torchao",
        "draccus",
        "trainer_core.train.build",
    ),
    "bench": ("zstandard", "torchao", "draccus", "trainer_core.train.build"),
    "ladder": ("ray", "zstandard", "trainer_core.ray.ladder_run"),
}
"""What each part imports, ours last: a missing package is named before the import it breaks.
Nothing of ``trainer_core`` is imported before the carried wheels are installed: it needs
draccus, which a bare GPU machine lacks."""
WHY_MISSING = {
    "ray": "carry it: make gpu-wheels packs a trimmed Ray, ray-*.tar.xz, then --wheels",
}
OLMO_1B = (
    *("--size", "1B", "--vocab-size", "100352", "--seq-len", "4096"),
    *("--batch-seqs", "8", "--micro-seqs", "4", "--steps", "10", "--warmup", "3"),
    *("--precision", "bf16", "--compile", "--profile"),
)
"""OLMo-core's 1B (its vocabulary padded to a multiple of 128), 32k tokens a step in micro-batches
of four sequences (on an H100 4.7% faster than two, 13% faster than one; 54 GiB): accumulation
keeps the optimizer step a small part of the time, as in a run."""
TARGETS = {"none": 64_000, "tensorwise": 76_800, "rowwise": 76_800}
"""Tokens/s per H100 to reach, by float8 recipe ("none": bf16): 60% MFU at 9.29 GFLOP a token
in bf16, and 1.2x that with float8 (issue 25; OLMo-core's 55k on its own 1B shape is 47.8% MFU,
about 50.9k on ours)."""
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
        f"{','.join(r['attention']) or 'inlined by compile'}, {r['device']}; Trainer loop "
        f"{r['loop_tokens_per_s']:,.0f} tokens/s, MFU {100 * r['loop_mfu']:.1f}%"
    )
    if "profile" in r:
        wall, families = r["profile"]["wall_ms"], r["profile"]["families_ms"]
        ranked = sorted(families.items(), key=lambda kv: -kv[1])
        detail += "; step time " + ", ".join(f"{f} {100 * ms / wall:.0f}%" for f, ms in ranked)
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


def use_carried_wheels(wheels: Path) -> None:
    """Install the wheels in ``wheels`` whose package this Python lacks into ``wheels/site``
    (offline, once) and put that first on this process's path and its children's."""
    site = wheels / "site"
    if site.is_dir():
        _put_first(site)
    missing = [w for w in sorted(wheels.glob("*.whl")) if not _importable(_package(w))]
    archives = [] if _importable("ray") else sorted(wheels.glob("ray-*.tar.xz"))
    if not missing and not archives:
        return
    if missing:
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
        pip += ["--no-compile", "--disable-pip-version-check", "--target", str(site)]
        if subprocess.run([*pip, *map(str, missing)]).returncode != 0:
            print(f"gpu-check: the wheels in {wheels} do not install here", file=sys.stderr)
    for archive in archives[-1:]:  # make gpu-wheels leaves one; of several, the last by name
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(site, filter="data")
        except (tarfile.TarError, OSError) as e:
            print(f"gpu-check: {archive} does not unpack here ({e})", file=sys.stderr)
    if str(site) not in sys.path:
        _put_first(site)
    importlib.invalidate_caches()


def _put_first(site: Path) -> None:
    """``site`` first on this process's path and on its children's (``PYTHONPATH``)."""
    sys.path.insert(0, str(site))
    paths = [str(site), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)


def _package(wheel: Path) -> str:
    """The import name of a wheel's package: its top-level entry named as the distribution, in
    any case (tensorboardX), else its first (rpds-py installs ``rpds``)."""
    dist = wheel.name.split("-")[0].lower()
    with zipfile.ZipFile(wheel) as whl:
        tops = {name.split("/")[0].removesuffix(".py") for name in whl.namelist()}
    tops = {top for top in tops if not top.endswith((".dist-info", ".data"))}
    return next((top for top in tops if top.lower() == dist), min(tops))


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # raised, not None, when a finder or a parent package refuses
        return False


def cannot_run(part: str) -> str | None:
    """Why ``part`` can't run with this Python, in one line; None when it can."""
    for name in NEEDS[part]:
        if "." not in name and not _importable(name):
            why = WHY_MISSING.get(name, "carry its wheel: make gpu-wheels, then --wheels")
            return f"{part}: not run, {name} is not installed ({why})"
        if "." in name:
            try:
                importlib.import_module(name)
            except ImportError as e:
                return f"{part}: not run, importing {name} failed: {e}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"some of {', '.join(PARTS)}")
    ap.add_argument(
        "--recipes",
        default=",".join(TARGETS),
        help="the bench part's float8 recipes, one process each (none = bf16)",
    )
    ap.add_argument(
        "--wheels", type=Path, default=ROOT / ".gpu-wheels", help="carried wheels (make gpu-wheels)"
    )
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if args.wheels.is_dir():
        use_carried_wheels(args.wheels)
    refused = [line for line in map(cannot_run, parts) if line]
    for line in refused:
        print(f"gpu-check: {line}", file=sys.stderr)
    parts = [part for part in parts if not any(r.startswith(f"{part}:") for r in refused)]
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

    from trainer_core.data.demo_corpus import CACHE_ENV  # after the wheels (zstandard, draccus)
    from trainer_core.devices import device_key

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        cache = os.environ.get(CACHE_ENV) or str(Path(tmp) / "cache")  # shared by parts if set
        env = {**os.environ, CACHE_ENV: cache, "PYTHONDONTWRITEBYTECODE": "1"}
        if "tests" in parts:
            record(cuda_tests(env))
        if "bench" in parts:
            for float8 in args.recipes.split(","):
                record(benchmark(float8, env))
        if "ladder" in parts:
            record(tiny_ladder(Path(tmp), env, device_key(name) or UNPLANNED_GPU))
    if checks:
        print(summary(checks))
    return 0 if checks and not refused and all(c.passed for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
