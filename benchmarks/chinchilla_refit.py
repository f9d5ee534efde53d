"""Refit Chinchilla's approach 3 on the points Epoch AI extracted, beside the published fits.

    python benchmarks/chinchilla_refit.py [--bootstrap 200]

Data: ``benchmarks/data/chinchilla/`` (see its README): 245 (N, C, loss) points from Hoffmann
et al. 2022's Figure 4. As Besiroglu et al. 2024 (Epoch AI) do: D = C / (6 N), the five points of
highest loss left out, Huber loss (delta 1e-3) on log loss. Our fit is
:func:`trainer_core.analysis.fits.fit_chinchilla`, the one every ladder's analysis runs; its
intervals come from residual resamples, once with every point its own group and once with the
points of one model size sharing an offset (the sizes from N: :func:`size_groups`; the figure's
colour is a scale of the loss, not the size). Epoch's intervals come from resampling points,
which also varies the design.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from trainer_core.analysis import ChinchillaFit, fit_chinchilla

DATA = Path(__file__).parent / "data" / "chinchilla" / "points.csv"
OUTLIERS = 5
"""Points of highest loss that Epoch's fit leaves out."""
EPOCH = {
    "E": (1.817, 1.769, 1.871),
    "A": (482.01, 285.2, 743.6),
    "B": (2085.43, 1042.4, 5810.3),
    "alpha": (0.3478, 0.317, 0.373),
    "beta": (0.3658, 0.331, 0.415),
}
"""Besiroglu et al. 2024: estimate and 95% interval (4,000 point resamples), from their
repository's ``data_analysis.ipynb``."""
HOFFMANN = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
"""Hoffmann et al. 2022, equation 10."""
CHINCHILLA_FLOPS = 6 * 70e9 * 1.4e12
"""Chinchilla's own training compute (70B parameters, 1.4T tokens)."""
SIZE_GAP = 1e-4
"""Log-N gap that starts a new size: a size's points differ by < 1e-6 (extraction noise), the two
closest sizes (N 1.424e9 and 1.429e9) by 3.4e-3; any gap from 1e-5 to 3e-3 gives the same 43 sizes."""


def load_points() -> pd.DataFrame:
    """The 240 points Epoch fits: tokens from compute, the five highest losses left out."""
    df = pd.read_csv(DATA)
    df["D"] = df["C"] / (6 * df["N"])
    return df[df["loss"] < df["loss"].nlargest(OUTLIERS).min()]


def size_groups(n: pd.Series, gap: float = SIZE_GAP) -> pd.Series:
    """One label per model size, from N: the points carry no size label of their own (their
    ``colour`` is the figure's loss scale, one colour per loss value), and N, read back from the
    figure, varies within a size only by extraction noise."""
    log_n = np.log(n.to_numpy(dtype=float))
    order = np.argsort(log_n)
    labels = np.empty(log_n.size, dtype=int)
    labels[order] = np.concatenate([[0], np.cumsum(np.diff(log_n[order]) > gap)])
    return pd.Series(labels, index=n.index, name="size")


def refits(points: pd.DataFrame, n_bootstrap: int) -> dict[str, ChinchillaFit]:
    """Our fit twice: points resampled one by one, and a size's points sharing an offset."""
    n, d, loss = points["N"], points["D"], points["loss"]
    return {
        "ours": fit_chinchilla(n, d, loss, n_bootstrap),
        "ours, by size": fit_chinchilla(n, d, loss, n_bootstrap, groups=size_groups(n)),
    }


def published(params: dict[str, float]) -> ChinchillaFit:
    """A published L(N, D) as our fit's type, for its exponent ``a`` and compute-optimal split."""
    return ChinchillaFit(**params, n_points=0, objective=math.nan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--bootstrap", type=int, default=200)
    args = ap.parse_args()
    points = load_points()
    started = time.time()
    fits = refits(points, args.bootstrap)
    elapsed = time.time() - started
    print(f"{len(points)} points, 2 fits with {args.bootstrap} resamples: {elapsed:.0f} s\n")
    header = ("ours [95%]", "ours, by size [95%]", "Epoch [95%]")
    print(f"{'':<6} " + " ".join(f"{h:>26}" for h in header) + f" {'Hoffmann':>9}")
    for name, (value, lo, hi) in EPOCH.items():
        cells = []
        for fit in fits.values():
            low, high = fit.ci[name]
            cells.append(f"{fit.params()[name]:.4g} [{low:.4g}, {high:.4g}]")
        cells.append(f"{value:.4g} [{lo:.4g}, {hi:.4g}]")
        print(f"{name:<6} {cells[0]:>26} {cells[1]:>26} {cells[2]:>26} {HOFFMANN[name]:>9.4g}")
    laws = {
        "ours": fits["ours"],
        "Epoch": published({k: v[0] for k, v in EPOCH.items()}),
        "Hoffmann": published(HOFFMANN),
    }
    print(
        "\nN_opt ~ C^a: " + ", ".join(f"a = {law.a:.3f} ({label})" for label, law in laws.items())
    )
    print(f"at Chinchilla's compute ({CHINCHILLA_FLOPS:.3g} FLOPs):")
    for label, law in laws.items():
        n_opt, d_opt = law.compute_optimal(CHINCHILLA_FLOPS)
        ratio = d_opt / n_opt
        print(
            f"  {label:<9} N_opt {n_opt:.3g}, D_opt {d_opt:.3g} ({ratio:.1f} tokens per parameter)"
        )


if __name__ == "__main__":
    main()
