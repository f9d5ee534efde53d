"""PNG plots of a ladder's scaling laws: loss vs compute with the frontier, isoFLOP parabolas."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from trainer_core.analysis.fits import ChinchillaFit, PowerLawFit
from trainer_core.analysis.isoflop import IsoFLOPFit
from trainer_core.analysis.plots import colors, interval_bars, save
from trainer_core.analysis.predict import LAW_CHINCHILLA, LAW_FRONTIER, ExtrapolationCheck


def plot_loss_vs_compute(
    points: pd.DataFrame,
    fit: PowerLawFit | None,
    frontier: pd.DataFrame | None,
    path: str | Path,
    held_out: ExtrapolationCheck | None = None,
) -> Path:
    """Write :func:`loss_vs_compute_figure` to a PNG at ``path``."""
    return save(loss_vs_compute_figure(points, fit, frontier, held_out), path)


def loss_vs_compute_figure(
    points: pd.DataFrame,
    fit: PowerLawFit | None,
    frontier: pd.DataFrame | None,
    held_out: ExtrapolationCheck | None = None,
) -> Figure:
    """Annealed eval loss vs FLOPs per size, the envelope and the L(C) fitted to it, and the
    held-out size's measured points beside both laws' predictions of them."""
    fig = Figure(figsize=(7.5, 5))
    ax = fig.add_subplot()
    sizes = list(points.sort_values("N").drop_duplicates("size")["size"])
    for size, color in zip(sizes, colors(len(sizes)), strict=True):
        p = points[points["size"] == size].sort_values("flops")
        ax.plot(p["flops"], p["eval_loss"], "o-", ms=4, lw=0.8, color=color, label=size)
    if frontier is not None and len(frontier):
        ax.scatter(
            frontier["flops"],
            frontier["eval_loss"],
            s=60,
            marker="s",
            color="k",
            alpha=0.15,
            label="frontier (lower envelope)",
        )
    lo, hi = points["flops"].min(), points["flops"].max()
    c = np.logspace(np.log10(lo) - 0.1, np.log10(hi) + 0.3, 200)
    if fit is not None:
        ax.plot(
            c,
            fit.predict(c),
            "k--",
            lw=1,
            label=f"frontier fit: {fit.E:.3g} + {fit.A:.3g} C^-{fit.alpha:.3f}",
        )
    if held_out is not None:
        _held_out(ax, held_out, c)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("eval loss (annealed points)")
    ax.set_title("loss vs compute: the compute-optimal frontier")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return fig


def _held_out(ax, held_out: ExtrapolationCheck, c: np.ndarray) -> None:
    """The held-out size's measured points, the frontier fitted without it, both predictions."""
    h = held_out.points
    without = held_out.fits.get(LAW_FRONTIER)
    if without is not None:
        ax.plot(c, without.predict(c), ":", color="red", lw=1, label="frontier fit without it")
    styles = {LAW_CHINCHILLA: ("*", 12, "gold"), LAW_FRONTIER: ("D", 7, "tab:blue")}
    for law, (marker, ms, color) in styles.items():
        p = held_out.prediction(law)
        if p is None:
            continue
        interval_bars(ax, p.flops, *p.interval, color=color)
        ax.plot(
            [p.flops],
            [p.predicted],
            marker,
            ms=ms,
            color=color,
            mec="k",
            zorder=5,
            label=f"{law} prediction ({100 * p.rel_error:+.2f}%)",
        )
    ax.scatter(
        h["flops"],
        h["actual"],
        s=140,
        facecolors="none",
        edgecolors="red",
        lw=1.5,
        label=f"held out {held_out.held_out_size} (measured)",
        zorder=6,
    )


def plot_isoflops(fit: IsoFLOPFit, law: ChinchillaFit | None, path: str | Path) -> Path:
    """Write :func:`isoflops_figure` to a PNG at ``path``."""
    return save(isoflops_figure(fit, law), path)


def isoflops_figure(fit: IsoFLOPFit, law: ChinchillaFit | None) -> Figure:
    """Left: loss vs N at each budget with its parabola and vertex. Right: N_opt vs C, the
    approach-2 line, and approach 3's N_opt(C) when its fit has a frontier."""
    fig = Figure(figsize=(12, 4.8))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    parabolas = fit.parabolas
    # Every budget on the right; on the left a readable subset (at most 8 curves).
    shown = parabolas[:: max(1, math.ceil(len(parabolas) / 8))]
    for p, color in zip(shown, colors(len(shown)), strict=True):
        left.scatter(p.N, p.loss, s=18, color=color, zorder=3)
        x = np.linspace(np.log(p.N.min()) - 0.2, np.log(p.N.max()) + 0.2, 100)
        style = "-" if p.valid else ":"
        left.plot(
            np.exp(x), np.polyval(p.coef, x), style, color=color, lw=1, label=f"C = {p.flops:.2g}"
        )
        if p.valid:
            left.scatter([p.n_opt], [p.loss_opt], marker="*", s=90, color=color, ec="k", zorder=4)
    left.set_xscale("log")
    left.set_xlabel("non-embedding parameters N")
    left.set_ylabel("eval loss at the budget (interpolated)")
    left.set_title("isoFLOP parabolas (star: minimum; dotted: not used)")
    left.legend(fontsize=7)
    left.grid(alpha=0.3, which="both")

    ok = [p for p in parabolas if p.valid]
    c = np.array([p.flops for p in ok])
    right.scatter(c, [p.n_opt for p in ok], color="C0", zorder=3, label="isoFLOP minima")
    grid = np.logspace(np.log10(c.min()) - 0.3, np.log10(c.max()) + 0.3, 50)
    right.plot(
        grid,
        [fit.compute_optimal(x)[0] for x in grid],
        "C0--",
        label=f"approach 2: N_opt ~ C^{fit.a:.3f}",
    )
    if law is not None and law.has_frontier:
        right.plot(
            grid,
            law.compute_optimal(grid)[0],
            "C1:",
            label=f"approach 3: N_opt ~ C^{law.a:.3f}",
        )
    right.set_xscale("log")
    right.set_yscale("log")
    # Budgets span about a decade: labelled minor ticks (2e11, 3e11, ...) would run together.
    right.xaxis.set_minor_formatter(NullFormatter())
    right.set_xlabel("compute budget C (FLOPs)")
    right.set_ylabel("compute-optimal N")
    right.set_title("N_opt(C)")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, which="both")
    return fig
