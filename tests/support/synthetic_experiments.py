"""Experiment dirs written to disk from known scaling-law constants, for the analysis tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

from trainer_core.analysis.synthetic_tasks import TaskTruth

TRUE = {"E": 1.7, "A": 400.0, "B": 410.0, "alpha": 0.34, "beta": 0.28}
LADDER_N = {
    "s1": 2_000_000,
    "s2": 5_000_000,
    "s3": 12_000_000,
    "s4": 30_000_000,
    "s5": 80_000_000,
    "s6": 200_000_000,
}
BATCH = 65_536
FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 1)
PEAK_LR = 1e-3


def chinchilla_loss(n: float, d: float) -> float:
    return TRUE["E"] + TRUE["A"] / n ** TRUE["alpha"] + TRUE["B"] / d ** TRUE["beta"]


def write_run(
    run_dir: Path,
    *,
    size: str,
    n: int,
    lr: float,
    total_steps: int,
    status: str = "finished",
    last_step: int | None = None,
    diverged_step: int | None = None,
    tags: dict | None = None,
    batch: int = BATCH,
    seq_len: int = 512,
) -> None:
    run_dir.mkdir(parents=True)
    record = {
        "name": run_dir.name,
        "size": size,
        "num_params": n,
        "flops_per_token": 6 * n,
        "peak_lr": lr,
        "global_batch_tokens": batch,
        "seq_len": seq_len,
        "total_steps": total_steps,
        "status": status,
        "diverged_step": diverged_step,
        "last_step": total_steps if last_step is None else last_step,
        "tags": tags or {},
    }
    (run_dir / "run.json").write_text(json.dumps(record))


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def write_checkpoint(
    run_dir: Path, step: int, ranks: list[int], world: int, metadata: bool = True
) -> Path:
    path = run_dir / "checkpoints" / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x")
    if metadata:
        (path / ".metadata").write_bytes(b"m")
    for r in ranks:
        (path / f".done-rank{r}-of-{world}").write_text('{"files": {}}')  # lists no files
    return path


TASK = "synth"
TASK_TRUTH = TaskTruth(E=0.4, A=60.0, B=60.0, ceiling=1.0, k=5.0, L0=1.0)
"""The task ``make_ladder(task=True)`` logs: its loss falls from ~1.55 to ~0.65 bits per byte
over the ladder, its accuracy rises from ~0.3 to ~0.9."""


def task_metrics(n: float, tokens: float, wobble: float = 0.0) -> dict[str, float]:
    """The ``task/synth/*`` metrics a run of ``n`` parameters logs at ``tokens``."""
    loss = float(TASK_TRUTH.loss(n, tokens)) * (1 + wobble)
    acc = TASK_TRUTH.chance + (TASK_TRUTH.ceiling - TASK_TRUTH.chance) / (
        1 + math.exp(TASK_TRUTH.k * (loss - TASK_TRUTH.L0))
    )
    return {
        f"task/{TASK}/acc": acc,
        f"task/{TASK}/acc_norm": acc,
        f"task/{TASK}/bpb": loss,
        f"task/{TASK}/chance": TASK_TRUTH.chance,
    }


def make_ladder(
    root: Path, noise: float = 0.001, sizes: dict[str, int] = LADDER_N, task: bool = False
) -> Path:
    """Each size trains 80 N tokens; annealed evals at 1/8..1 of the run, plus a pre-decay eval
    at peak LR (0.2 above the curve) that the fits must leave out. ``task``: every eval also
    scores :data:`TASK` (the pre-decay one with a 30% higher task loss)."""
    k = 0
    for size, n in sizes.items():
        steps = round(80 * n / BATCH)
        run_dir = root / "runs" / size
        write_run(
            run_dir,
            size=size,
            n=n,
            lr=PEAK_LR,
            total_steps=steps,
            tags={"ladder": "syn", "multiple": 4},
        )
        lines = []
        for frac in FRACTIONS:
            step = round(frac * steps)
            loss = chinchilla_loss(n, step * BATCH) * (1 + noise * math.sin(1.7 * k))
            k += 1
            lines.append(
                {
                    "step": step,
                    "tokens": step * BATCH,
                    "train/loss": loss + 0.05,
                    "lr": 0.1 * PEAK_LR,
                }
            )
            tasks = task_metrics(n, step * BATCH, noise * math.cos(1.3 * k)) if task else {}
            lines.append({"step": step, "tokens": step * BATCH, "eval/loss": loss, **tasks})
            point = {
                "step": step,
                "tokens": step * BATCH,
                "eval/loss": loss,
                "train/loss": loss + 0.05,
                "lr": 0.1 * PEAK_LR,
                **tasks,
            }
            (run_dir / f"metrics_step{step}.json").write_text(json.dumps(point))
            write_checkpoint(run_dir, step, [0, 1], 2)
        pre = round(0.4 * steps)
        pre_point = {
            "step": pre,
            "tokens": pre * BATCH,
            "eval/loss": chinchilla_loss(n, pre * BATCH) + 0.2,
            "lr": PEAK_LR,
        }
        if task:
            pre_point.update(task_metrics(n, pre * BATCH, 0.3))
        (run_dir / f"metrics_step{pre}.json").write_text(json.dumps(pre_point))
        write_jsonl(run_dir / "metrics.jsonl", sorted(lines, key=lambda r: r["step"]))
    return root


SWEEP_N = {"a": 1_000_000, "b": 4_000_000, "c": 16_000_000, "d": 64_000_000}
SWEEP_B = -0.4


def true_lr(n: float) -> float:
    return 0.02 * (n / 1e6) ** SWEEP_B


def make_sweep(root: Path) -> Path:
    """Loss = L0(N) + 0.05 (ln lr - ln lr*)^2 on a factor-2 grid offset from lr*; per size one
    diverged trial at the top LR (with a spuriously low logged loss) and an early-stopped one."""
    (root / "experiment.yaml").write_text("name: sweep\nsweep: {search: grid}\n")
    for size, n in SWEEP_N.items():
        base = 3.0 + 10 / math.log(n)
        for k in range(-3, 4):
            lr = true_lr(n) * 2.0 ** (k + 0.3)
            name = f"{size}-lr{lr:.3e}"
            loss = base + 0.05 * (math.log(lr) - math.log(true_lr(n))) ** 2
            run = {"size": size, "n": n, "lr": lr, "total_steps": 100}
            if k == 3:
                write_run(
                    root / "runs" / name, **run, status="diverged", last_step=40, diverged_step=41
                )
                write_jsonl(
                    root / "runs" / name / "metrics.jsonl",
                    [{"step": 40, "tokens": 40 * BATCH, "eval/loss": 0.5}],
                )
                continue
            stopped = k == -3
            last = 50 if stopped else 100
            status = "stopped" if stopped else "finished"
            write_run(root / "runs" / name, **run, status=status, last_step=last)
            write_jsonl(
                root / "runs" / name / "metrics.jsonl",
                [
                    {
                        "step": 50,
                        "tokens": 50 * BATCH,
                        "train/loss": loss + 0.3,
                        "eval/loss": loss + 0.2,
                    },
                    *(
                        []
                        if stopped
                        else [
                            {
                                "step": 100,
                                "tokens": 100 * BATCH,
                                "train/loss": loss + 0.1,
                                "eval/loss": loss,
                            }
                        ]
                    ),
                ],
            )
    return root


def is_png(path: Path) -> bool:
    return (
        path.is_file()
        and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        and path.stat().st_size > 5000
    )
