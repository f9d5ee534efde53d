"""PNG plots of a ladder's scaling laws: loss vs compute with the frontier, isoFLOP parabolas."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import ListedColormap, LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from trainer_core.analysis.bootstrap import CI_LEVEL
from trainer_core.analysis.fits import ChinchillaFit, PowerLawFit
from trainer_core.analysis.isoflop import IsoFLOPFit, IsoFLOPParabola
from trainer_core.analysis.plots import (
    COMPUTE_LABEL,
    CompactLogFormatter,
    beside,
    colors,
    figure_axes,
    interval_bars,
    save,
)
from trainer_core.analysis.predict import LAW_CHINCHILLA, LAW_FRONTIER, ExtrapolationCheck

MAX_CURVES = 10
"""Parabolas the isoFLOP panel draws before it leaves unused budgets out, and names in a legend
(more: a colour bar of C). Every used budget is drawn, however many."""

BUDGET_COLORS = ListedColormap(colormaps["viridis"](np.linspace(0, 0.9, 256)))
"""Viridis without its palest tenth, as :func:`~trainer_core.analysis.plots.colors` draws."""


def plot_loss_vs_compute(
    points: pd.DataFrame,
    fit: PowerLawFit | None,
    frontier: pd.DataFrame | None,
    path: str | Path,
    held_out: ExtrapolationCheck | None = None,
    target_flops: float | None = None,
) -> Path:
    """Write :func:`loss_vs_compute_figure` to a PNG at ``path``."""
    return save(loss_vs_compute_figure(points, fit, frontier, held_out, target_flops), path)


def loss_vs_compute_figure(
    points: pd.DataFrame,
    fit: PowerLawFit | None,
    frontier: pd.DataFrame | None,
    held_out: ExtrapolationCheck | None = None,
    target_flops: float | None = None,
    *,
    ax: Axes | None = None,
) -> Figure:
    """Annealed eval loss vs FLOPs per size, the envelope and the L(C) fitted to it with its
    bootstrap band, and the held-out size's measured points beside both laws' predictions of
    them. ``target_flops``: the axis reaches that budget and marks it, so the band shows how
    far the answer there is extrapolated."""
    fig, ax = figure_axes(ax, (7.5, 5))
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
    reach = max(hi, target_flops or hi)
    c = np.logspace(np.log10(lo) - 0.1, np.log10(reach) + 0.3, 200)
    if fit is not None:
        ax.plot(
            c,
            fit.predict(c),
            "k--",
            lw=1,
            label=f"frontier fit: {fit.E:.3g} + {fit.A:.3g} C^-{fit.alpha:.3f}",
        )
        band_lo, band_hi = fit.predict_interval(c)
        if np.any(np.isfinite(band_lo)):
            ax.fill_between(
                c,
                band_lo,
                band_hi,
                color="k",
                alpha=0.1,
                lw=0,
                label=f"frontier fit: {100 * CI_LEVEL:.0f}% bootstrap band",
            )
    if target_flops is not None:
        ax.axvline(target_flops, color="0.4", ls=":", lw=1, label=f"target {target_flops:.3g}")
    if held_out is not None:
        _held_out(ax, held_out, c)
    ax.set_xscale("log")
    ax.set_xlabel(COMPUTE_LABEL)
    ax.set_ylabel("eval loss (annealed points)")
    ax.set_title("loss vs compute: the compute-optimal frontier")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return fig


def _held_out(ax: Axes, held_out: ExtrapolationCheck, c: np.ndarray) -> None:
    """The held-out size's measured points, the frontier fitted without it, both predictions
    with their intervals either side of the point they predict (``c``: the axis' compute)."""
    h = held_out.points
    without = held_out.fits.get(LAW_FRONTIER)
    if without is not None:
        ax.plot(c, without.predict(c), ":", color="red", lw=1, label="frontier fit without it")
    # Both laws predict the same point: each drawn beside it, L(N, D) left, so neither hides.
    styles = {LAW_CHINCHILLA: ("*", 12, "gold", -1), LAW_FRONTIER: ("D", 7, "tab:blue", 1)}
    for law, (marker, ms, color, side) in styles.items():
        p = held_out.prediction(law)
        if p is None:
            continue
        x = beside(p.flops, c[0], c[-1], side)
        interval_bars(ax, x, *p.interval, color=color)
        ax.plot(
            [x],
            [p.predicted],
            marker,
            ms=ms,
            color=color,
            mec="k",
            zorder=5,
            label=f"{law} prediction, {100 * CI_LEVEL:.0f}% interval ({100 * p.rel_error:+.2f}%)",
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
    """Left: loss vs N at each used budget (and unused ones up to MAX_CURVES) with its parabola
    and vertex. Right: N_opt vs C, the approach-2 line with its bootstrap band, and approach 3's
    N_opt(C) when its fit has a frontier."""
    fig = Figure(figsize=(12, 4.8))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    _parabolas_panel(fig, left, fit.parabolas)
    _n_opt_panel(right, fit, law)
    return fig


def _shown_parabolas(parabolas: list[IsoFLOPParabola]) -> list[IsoFLOPParabola]:
    """Every used budget, and the unused ones evenly thinned to what room MAX_CURVES leaves:
    a subset of the used ones had the panel disagree with the minima beside it."""
    used = [p for p in parabolas if p.valid]
    unused = [p for p in parabolas if not p.valid]
    room = min(max(MAX_CURVES - len(used), 0), len(unused))
    kept = [unused[round(i)] for i in np.linspace(0, len(unused) - 1, room)]
    return sorted(used + kept, key=lambda p: p.flops)


def _parabolas_panel(fig: Figure, ax: Axes, parabolas: list[IsoFLOPParabola]) -> None:
    """Each shown budget's points, parabola (dotted: not used) and vertex, coloured by log C;
    the title counts the unused budgets left out."""
    shown = _shown_parabolas(parabolas)
    flops = np.array([p.flops for p in shown])
    norm = LogNorm(flops.min(), flops.max())
    for p in shown:
        color = BUDGET_COLORS(norm(p.flops))
        ax.scatter(p.N, p.loss, s=18, color=color, zorder=3)
        x = np.linspace(np.log(p.N.min()) - 0.2, np.log(p.N.max()) + 0.2, 100)
        style = "-" if p.valid else ":"
        ax.plot(
            np.exp(x), np.polyval(p.coef, x), style, color=color, lw=1, label=f"C = {p.flops:.2g}"
        )
        if p.valid:
            ax.scatter([p.n_opt], [p.loss_opt], marker="*", s=90, color=color, ec="k", zorder=4)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(CompactLogFormatter())
    ax.xaxis.set_minor_formatter(CompactLogFormatter())
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("eval loss at the budget (interpolated)")
    title = "isoFLOP parabolas (star: minimum; dotted: not used)"
    unused = sum(not p.valid for p in parabolas)
    left_out = len(parabolas) - len(shown)
    if left_out:
        title += f"\nevery used budget; {left_out} of the {unused} unused left out"
    ax.set_title(title)
    if len(shown) <= MAX_CURVES:
        ax.legend(fontsize=7)
    else:
        fig.colorbar(ScalarMappable(norm, BUDGET_COLORS), ax=ax, label="compute budget C")
    ax.grid(alpha=0.3, which="both")


def _n_opt_panel(ax: Axes, fit: IsoFLOPFit, law: ChinchillaFit | None) -> None:
    """The used budgets' minima, approach 2's N_opt(C) and its band, approach 3's N_opt(C)."""
    ok = [p for p in fit.parabolas if p.valid]
    c = np.array([p.flops for p in ok])
    ax.scatter(c, [p.n_opt for p in ok], color="C0", zorder=3, label="isoFLOP minima")
    grid = np.logspace(np.log10(c.min()) - 0.3, np.log10(c.max()) + 0.3, 50)
    ax.plot(
        grid,
        [fit.compute_optimal(x)[0] for x in grid],
        "C0--",
        label=f"approach 2: N_opt ~ C^{fit.a:.3f}",
    )
    _n_opt_band(ax, fit, grid)
    if law is not None and law.has_frontier:
        ax.plot(
            grid,
            law.compute_optimal(grid)[0],
            "C1:",
            label=f"approach 3: N_opt ~ C^{law.a:.3f}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    # Budgets span about a decade: labelled minor ticks (2e11, 3e11, ...) would run together.
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(CompactLogFormatter())
    ax.yaxis.set_minor_formatter(CompactLogFormatter())
    ax.set_xlabel(COMPUTE_LABEL)
    ax.set_ylabel("compute-optimal N")
    ax.set_title("N_opt(C)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")


def _n_opt_band(ax: Axes, fit: IsoFLOPFit, grid: np.ndarray) -> None:
    """Approach 2's bootstrap interval of N_opt at each C of ``grid``: the interval the target
    table gives, drawn where the fit has resamples (none without a bootstrap)."""
    if not fit.samples:
        return
    lo, hi = np.array([fit.optimal_intervals(x)["N"] for x in grid]).T
    ok = np.isfinite(lo) & np.isfinite(hi)
    if not ok.any():
        return
    of = f" ({fit.resamples_used()})" if fit.n_failed else ""
    ax.fill_between(
        grid[ok],
        lo[ok],
        hi[ok],
        color="C0",
        alpha=0.15,
        lw=0,
        label=f"approach 2: {100 * CI_LEVEL:.0f}% bootstrap band{of}",
    )
