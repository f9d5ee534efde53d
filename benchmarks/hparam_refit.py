"""Refit Step Law's released LR x batch sweeps with our hyperparameter laws; print our exponents
beside the published ones.

    python benchmarks/hparam_refit.py [--loss loss|raw_loss] [--bootstrap 1000] [--plots DIR]

Data: benchmarks/data/steplaw/ (Li et al. 2025, "Predictable Scale: Part I"; 1,911 dense runs,
17 (N, D) cells, each a grid of 12 LRs x 10 batch sizes). Published: LR* = 1.79 N^-0.713
D^0.307, B* = 0.58 D^0.571, with 95% ranges from the 1,000 bootstrap fits they released.

Two methods on the same data. Ours: per cell, the vertex of a parabola in log LR (log batch)
through the lowest points of the cell's curve (the lowest loss over the other hyperparameter at
each value), then a weighted power law through the cells. Theirs, re-implemented as a cross-check:
every run within 0.25% of its cell's lowest loss is a near-optimal point, and one ordinary
least-squares line of log LR (log batch) on log N, log D goes through all of them.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from trainer_core.analysis.hparam_heldout import leave_one_out
from trainer_core.analysis.hparam_laws import HparamLawFit, fit_hparam_law, fit_hparam_laws

DATA = Path(__file__).parent / "data" / "steplaw" / "dense_lr_bs_loss.csv"
PUBLISHED = {
    "lr": {"c": (1.797, 0.523, 5.84), "N": (-0.713, -0.774, -0.655), "D": (0.307, 0.271, 0.345)},
    "batch": {"c": (0.581, 0.258, 1.379), "D": (0.571, 0.534, 0.606)},
}
"""(mean, 2.5%, 97.5%) over Step Law's 1,000 released bootstrap fits
(data/1004_fitted_lr_bs_scaling_model_parameters.csv of step-law/steplaw; c = exp(intercept))."""
NEAR_OPTIMAL = 0.0025
"""Step Law's selection: runs within 0.25% of their cell's lowest loss."""


def near_optimal_fit(df: pd.DataFrame, param: str, terms: tuple[str, ...]) -> dict[str, float]:
    """Step Law's estimator: least squares of log ``param`` over the near-optimal runs."""
    best = df.groupby(["N", "D"])["loss"].transform("min")
    near = df[df["loss"] / best - 1 < NEAR_OPTIMAL]
    X = np.stack([np.ones(len(near))] + [np.log(near[t].to_numpy(float)) for t in terms], axis=1)
    coef, *_ = np.linalg.lstsq(X, np.log(near[param].to_numpy(float)), rcond=None)
    return {"c": math.exp(coef[0]), **dict(zip(terms, coef[1:], strict=True)), "runs": len(near)}


def table(law: HparamLawFit, published: dict, near: dict[str, float]) -> list[str]:
    rows = [f"  {'':4} {'ours (95% CI)':>28} {'published (95%)':>28} {'their method here':>18}"]
    for key in ["c", *law.terms]:
        value = law.c if key == "c" else law.exponents[key]
        lo, hi = law.ci[key]
        ours = (
            f"{value:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            if key != "c"
            else f"{value:.3g} [{lo:.3g}, {hi:.3g}]"
        )
        if key in published:
            p, plo, phi = published[key]
            theirs = (
                f"{p:+.3f} [{plo:+.3f}, {phi:+.3f}]"
                if key != "c"
                else f"{p:.3g} [{plo:.3g}, {phi:.3g}]"
            )
        else:
            theirs = "(not in their law)"
        name = {"c": "c", "N": "a", "D": "b"}[key]
        mine = f"{near[key]:+.3f}" if key != "c" else f"{near[key]:.3g}"
        rows.append(f"  {name:4} {ours:>28} {theirs:>28} {mine:>18}")
    return rows


def coverage(checks: list) -> str:
    missed = [c.measured.label for c in checks if not c.covered]
    line = f"{sum(c.covered for c in checks)}/{len(checks)} held-out cells inside their interval"
    return line + (f" (outside: {'; '.join(missed)})" if missed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loss", default="loss", choices=["loss", "raw_loss"])
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--plots", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()

    if not DATA.is_file():
        raise SystemExit(
            f"error: {DATA} is missing: see {DATA.parent / 'README.md'} for how to get it"
        )
    raw = pd.read_csv(DATA)
    df = raw.assign(loss=raw[args.loss])[["N", "D", "lr", "batch", "loss"]]
    print(
        f"Step Law dense sweeps: {len(df)} runs, {df.groupby(['N', 'D']).ngroups} (N, D) cells, "
        f"{df['N'].nunique()} sizes; loss column: {args.loss}\n"
    )
    laws = fit_hparam_laws(df, n_bootstrap=args.bootstrap)
    print(f"{laws}\n")
    both = fit_hparam_law(laws.batch_cells, ("N", "D"), args.bootstrap, seed=1)
    print("B* as a law of N and D:")
    print(f"{both}\n")

    print("LR*(N, D) = c N^a D^b")
    print("\n".join(table(laws.lr, PUBLISHED["lr"], near_optimal_fit(df, "lr", ("N", "D")))))
    print("B*(D) = c D^b (tokens)")
    print("\n".join(table(laws.batch, PUBLISHED["batch"], near_optimal_fit(df, "batch", ("D",)))))
    print("B*(N, D) = c N^a D^b (tokens)")
    print("\n".join(table(both, {}, near_optimal_fit(df, "batch", ("N", "D")))))

    print("\nLeave one cell out (law refitted without it, its own optimum against the prediction):")
    print(f"  LR*: {coverage(leave_one_out(laws.lr_cells, ('N', 'D'), args.bootstrap))}")
    print(f"  B*(D): {coverage(leave_one_out(laws.batch_cells, ('D',), args.bootstrap))}")
    print(f"  B*(N, D): {coverage(leave_one_out(laws.batch_cells, ('N', 'D'), args.bootstrap))}")
    print("\nAt Step Law's example (N = 7e9, D = 1.4e12):")
    print(f"  ours: {laws.predict(7e9, 1.4e12)}")
    lr_pub = 1.79 * 7e9**-0.713 * 1.4e12**0.307
    b_pub = 0.58 * 1.4e12**0.571
    print(f"  published law: lr* = {lr_pub:.4g}, B* = {b_pub:.4g} tokens")

    if args.plots is not None:
        from trainer_core.analysis.plots_hparams import plot_hparam_laws

        for path in plot_hparam_laws(df, laws.lr, laws.batch, args.plots):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
