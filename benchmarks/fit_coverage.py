"""Do the fits' 95% bootstrap intervals cover the truth 95% of the time? Synthetic replicates.

    python benchmarks/fit_coverage.py [--replicates 50] [--bootstrap 100] [--noise 0.005]
                                      [--size-noise 0] [--sizes 7] [--workers 2]

Each replicate draws a WSD-S-like ladder from the published Chinchilla law (E=1.69, A=406.4,
B=410.7, alpha=0.34, beta=0.28): sizes doubling from 1e7, annealed points at 1/8..8 x 20 N
tokens, log-normal noise per point (plus, with --size-noise, an offset shared by a size's points).
It fits L(N, D) (approach 3), the frontier L(C) and the isoFLOP line (approach 2) with their
bootstrap intervals and counts how often each interval holds the true value: E, alpha, beta of
L(N, D); the frontier exponent alpha_C = alpha beta / (alpha + beta); a = beta / (alpha + beta).
Then the largest size is held out and predicted from the others, as the ladder's report does
(``extrapolation_check``): how often its interval holds the measured (noisy) final loss, and the
law's noise-free loss there.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one process per core; BLAS threads only contend

import numpy as np  # noqa: E402

from trainer_core.analysis.fits import fit_chinchilla  # noqa: E402
from trainer_core.analysis.frontier import fit_frontier  # noqa: E402
from trainer_core.analysis.isoflop import fit_isoflop  # noqa: E402
from trainer_core.analysis.predict import LAW_CHINCHILLA, extrapolation_check  # noqa: E402
from trainer_core.analysis.synthetic import CHINCHILLA, SyntheticLadder  # noqa: E402

LAW = CHINCHILLA
ALPHA_C = LAW.alpha * LAW.beta / (LAW.alpha + LAW.beta)


def replicate(args: tuple[SyntheticLadder, int, int]) -> dict[str, tuple[float, ...]]:
    """(truth, estimate, CI low, CI high) of every quantity scored, for one synthetic ladder."""
    ladder, seed, n_bootstrap = args
    pts = ladder.points(seed)
    chin = fit_chinchilla(
        pts["N"], pts["tokens"], pts["eval_loss"], n_bootstrap, seed, groups=pts["size"]
    )
    front = fit_frontier(pts, n_bootstrap, seed, smoother=chin)
    iso = fit_isoflop(pts, n_bootstrap, seed, smoother=chin)
    scored = {
        "E": (LAW.E, chin.E, *chin.ci["E"]),
        "alpha": (LAW.alpha, chin.alpha, *chin.ci["alpha"]),
        "beta": (LAW.beta, chin.beta, *chin.ci["beta"]),
        "frontier alpha_C": (ALPHA_C, front.alpha, *front.ci["alpha"]),
        "isoFLOP a": (LAW.a, iso.a, *iso.ci["a"]),
    }
    held = extrapolation_check(pts, n_bootstrap, seed)
    pred = held.prediction(LAW_CHINCHILLA)  # None with 3 sizes: L(N, D) needs 3 without it
    if pred is not None:
        law_there = float(LAW.predict(held.held_out_N, held.tokens))
        scored["held-out measured"] = (held.actual, pred.predicted, *pred.interval)
        scored["held-out law"] = (law_there, pred.predicted, *pred.interval)
    return scored


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicates", type=int, default=50)
    p.add_argument("--bootstrap", type=int, default=100, help="resamples per fit")
    p.add_argument("--noise", type=float, default=0.005, help="log-normal sd per point")
    p.add_argument("--size-noise", type=float, default=0.0, help="log-normal sd per size")
    p.add_argument("--sizes", type=int, default=7, help="sizes, doubling from 1e7")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()

    ladder = SyntheticLadder(n_sizes=args.sizes, noise=args.noise, size_noise=args.size_noise)
    started = time.perf_counter()
    jobs = [(ladder, seed, args.bootstrap) for seed in range(args.replicates)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(replicate, jobs))
    wall = time.perf_counter() - started

    print(
        f"{args.replicates} replicates x {args.bootstrap} resamples: {args.sizes} sizes x "
        f"{len(ladder.multiples)} annealed points, noise {args.noise:g} per point, "
        f"{args.size_noise:g} per size; {wall:.0f} s on {args.workers} workers"
    )
    print(f"{'quantity':<19}{'truth':>8}{'coverage':>10}{'median est':>12}{'median CI width':>17}")
    for name in results[0]:
        truth, est, lo, hi = (np.array([r[name][i] for r in results]) for i in range(4))
        covered = np.mean((lo <= truth) & (truth <= hi))
        width = np.nanmedian(hi - lo)
        print(
            f"{name:<19}{np.median(truth):>8.4f}{covered:>10.0%}{np.median(est):>12.4f}"
            f"{width:>17.4f}"
        )
    n = args.replicates
    print(
        "held-out: the largest size predicted from the others; truth column: its median. "
        f"A coverage near 95% has a standard error of {np.sqrt(0.95 * 0.05 / n):.0%} over {n} "
        "replicates"
    )


if __name__ == "__main__":
    main()
