"""Do the two-step task prediction's 95% intervals hold the truth 95% of the time?

    python benchmarks/task_coverage.py [--replicates 100] [--bootstrap 100] [--workers 2]
                                       [--size-noise 0.01] [--noise 0.005] [--questions 1000]
                                       [--floor 0.4]

Each replicate draws a task ladder (``trainer_core.analysis.synthetic_tasks``: five sizes
2e7..4e8 at 1/2/5/10x Chinchilla, four checkpoints a run) whose task loss follows a known
L(N, D) and whose accuracy follows a known sigmoid, with a ladder's noise: a per-size offset of
the task loss (runs of a size share a seed), per-point scatter, binomial accuracy over
``--questions`` questions. It fits both steps and predicts a target 10x the largest size at
5x Chinchilla, then counts how often the intervals of the task loss and of the accuracy hold the
true values. ``--floor``: the true sigmoid's floor (default: chance), for a metric that plateaus
above chance as the demo's calibrated accuracy does.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one process per core; BLAS threads only contend

import numpy as np  # noqa: E402

from trainer_core.analysis.synthetic_tasks import SIZES, TaskTruth, task_ladder  # noqa: E402
from trainer_core.analysis.tasks import fit_task  # noqa: E402

TARGET_N = 10 * max(SIZES)
TARGET_D = 100 * TARGET_N


def replicate(args: tuple[int, int, float, float, int, TaskTruth]) -> tuple[bool, bool, float]:
    """(loss covered, accuracy covered, accuracy error) of one synthetic ladder."""
    seed, n_bootstrap, size_noise, noise, questions, truth = args
    table = task_ladder(truth, seed, size_noise=size_noise, point_noise=noise, questions=questions)
    points = table.rename(columns={"run": "name", "D": "tokens"}).assign(size=table["N"])
    law = fit_task(points, "synth", truth.chance, n_bootstrap=n_bootstrap, seed=seed)
    true_loss = float(truth.loss(TARGET_N, TARGET_D))
    pred = law.predict(TARGET_N, TARGET_D, "", true_loss, float(truth.acc(TARGET_N, TARGET_D)))
    lo, hi = pred.loss_interval
    return bool(lo <= true_loss <= hi), pred.covers, pred.acc_error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicates", type=int, default=100)
    parser.add_argument("--bootstrap", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size-noise", type=float, default=0.01)
    parser.add_argument("--noise", type=float, default=0.005)
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--floor", type=float, help="the true sigmoid's floor (default: chance)")
    args = parser.parse_args()
    start = time.time()
    truth = TaskTruth(ceiling=1.0, floor=args.floor)  # the fit's default ceiling is 1 too
    jobs = [
        (seed, args.bootstrap, args.size_noise, args.noise, args.questions, truth)
        for seed in range(args.replicates)
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(replicate, jobs))
    loss_cov, acc_cov, errors = (np.array(col) for col in zip(*results, strict=True))
    n = len(results)
    se = lambda p: np.sqrt(p * (1 - p) / n)  # noqa: E731
    print(
        f"{n} synthetic ladders, {args.bootstrap} bootstrap resamples per step, target "
        f"N={TARGET_N:.2g} D={TARGET_D:.2g} (true task loss "
        f"{float(truth.loss(TARGET_N, TARGET_D)):.4f}, accuracy "
        f"{float(truth.acc(TARGET_N, TARGET_D)):.3f}; sigmoid floor {truth.sigmoid[0]:.3g})"
    )
    print(f"noise: size offset {args.size_noise}, point {args.noise}, {args.questions} questions")
    for name, cov in (("task loss", loss_cov), ("accuracy", acc_cov)):
        p = cov.mean()
        print(
            f"95% interval of the {name:<9} holds the truth: {p:.0%} "
            f"(standard error {se(p):.0%} over {n} replicates)"
        )
    print(
        f"accuracy error: mean {100 * errors.mean():+.2f} points, "
        f"mean |error| {100 * np.abs(errors).mean():.2f} points"
    )
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
