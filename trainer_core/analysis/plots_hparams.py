"""PNG plots of the hyperparameter laws: the sweep per (N, D) cell with its fitted optimum, LR*
against N and against D with the law, B* against D.

Figures are ``matplotlib.figure.Figure`` objects (no pyplot), as in ``plots.py``: a ``plot_*``
function saves the Figure its ``*_figure`` twin builds, so tests check what is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter

from trainer_core.analysis.hparam_laws import SYMBOL, CellOptimum, HparamLawFit, Param
from trainer_core.analysis.plots import colors, draw_optimum, save

LABEL = {"lr": "peak learning rate", "batch": "batch size (tokens)"}


def plot_cell_sweeps(
    df: pd.DataFrame, cells: list[CellOptimum], path: str | Path, param: Param = "lr"
) -> Path:
    """Write :func:`cell_sweeps_figure` to a PNG at ``path``."""
    return save(cell_sweeps_figure(df, cells, param), path)


def cell_sweeps_figure(df: pd.DataFrame, cells: list[CellOptimum], param: Param = "lr") -> Figure:
    """Loss against ``param`` (log x), one panel per N and one colour per D: the lowest loss at
    each value (over the other hyperparameter), the fitted optimum as a star with its 95%
    interval; an optimum at the grid's edge as a hollow star (:func:`draw_optimum`). The y range stops 6% above the
    panel's highest optimum, so a divergence wall does not flatten the minima."""
    sizes = sorted({c.N for c in cells})
    fig = Figure(figsize=(4.2 * len(sizes), 4))
    axes = fig.subplots(1, len(sizes), squeeze=False)[0]
    usable = df[np.isfinite(df["loss"].astype(float))]
    if "stopped" in usable.columns:
        usable = usable[~usable["stopped"].eq(True)]
    for ax, n in zip(axes, sizes, strict=True):
        mine = sorted((c for c in cells if n == c.N), key=lambda c: c.D)
        for cell, color in zip(mine, colors(len(mine)), strict=True):
            rows = usable[(usable["N"] == n) & (usable["D"] == cell.D)]
            curve = rows.groupby(param)["loss"].min().sort_index()
            ax.plot(curve.index, curve.to_numpy(), "o-", ms=3, lw=1, color=color)
            draw_optimum(
                ax,
                cell.loss,
                cell.value,
                cell.low,
                cell.high,
                cell.at_edge,
                "x",
                color,
                marker="*",
                ms=12,
                label=f"D={cell.D:.3g}",
            )
        optima = [c.loss for c in mine]
        ax.set_ylim(min(optima) - 0.01 * abs(min(optima)), max(optima) + 0.06 * abs(max(optima)))
        ax.set_xscale("log")
        # A panel spans a decade or so: 1 and 3 per decade labelled, the minor ticks not (their
        # labels, 2e-3 3e-3 4e-3 ..., ran together on a half-width panel).
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 3.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(LABEL[param])
        ax.set_title(f"N = {n:.3g}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("loss (lowest over the other hyperparameter)")
    return fig


def plot_hparam_law(law: HparamLawFit, path: str | Path, x: str = "N") -> Path:
    """Write :func:`hparam_law_figure` to a PNG at ``path``."""
    return save(hparam_law_figure(law, x), path)


def hparam_law_figure(law: HparamLawFit, x: str = "N") -> Figure:
    """Cell optima against ``x`` ("N" or "D", log-log) with their 95% intervals, one colour per
    value of the other variable, and the law: one dashed line per value of the other when the
    law depends on it, else a single line with its 95% band. Cells excluded from the fit (optimum
    at the grid's edge) are hollow, without a bar (:func:`draw_optimum`)."""
    other = "D" if x == "N" else "N"
    cells = law.cells + law.excluded
    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.add_subplot()
    groups = sorted({getattr(c, other) for c in cells})
    for value, color in zip(groups, colors(len(groups)), strict=True):
        fitted = [c for c in law.cells if getattr(c, other) == value]
        edge = [c for c in law.excluded if getattr(c, other) == value]
        drawn = fitted + edge
        draw_optimum(
            ax,
            [getattr(c, x) for c in drawn],
            [c.value for c in drawn],
            [c.low for c in drawn],
            [c.high for c in drawn],
            [False] * len(fitted) + [True] * len(edge),
            color=color,
            label=f"{other}={value:.3g}" if fitted else None,
        )
        if other in law.terms and len(groups) > 1:
            span = [getattr(c, x) for c in cells if getattr(c, other) == value]
            _line(ax, law, x, value, span, color, band=False)
    if other not in law.terms or len(groups) == 1:
        _line(ax, law, x, groups[0], [getattr(c, x) for c in cells], "k", band=True)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("non-embedding parameters N" if x == "N" else "tokens D")
    ax.set_ylabel(f"optimal {LABEL[law.param]}")
    exps = " ".join(f"{t}^{law.exponents[t]:+.3f}" for t in law.terms)
    ax.set_title(f"{SYMBOL[law.param]} = {law.c:.3g} {exps}  (hollow: not bracketed)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return fig


def _line(
    ax: Axes, law: HparamLawFit, x: str, other: float, span: list[float], color: Any, band: bool
) -> None:
    """The law along ``x`` at a fixed value of the other variable, a little past the data."""
    grid = np.geomspace(min(span) / 1.3, max(span) * 1.3, 30)
    at = [law.predict(*((g, other) if x == "N" else (other, g))) for g in grid]
    ax.plot(grid, [p[0] for p in at], "--", lw=1, color=color)
    if band:
        ax.fill_between(grid, [p[1] for p in at], [p[2] for p in at], color=color, alpha=0.15)


def plot_hparam_laws(
    df: pd.DataFrame,
    lr: HparamLawFit | None,
    batch: HparamLawFit | None,
    out_dir: str | Path,
    cells: dict[Param, list[CellOptimum]] | None = None,
) -> list[Path]:
    """Every figure of the laws into ``out_dir``: the LR sweeps per cell, LR* against N and
    against D, and (batch swept) the batch sweeps per cell and B* against D. A law that is None
    (refused, or not fitted) draws its cells' sweeps alone, from ``cells``, where why shows."""
    out = Path(out_dir)
    paths = []
    for param, law, against in (("lr", lr, ("N", "D")), ("batch", batch, ("D",))):
        swept = law.cells + law.excluded if law is not None else (cells or {}).get(param, [])
        if swept:
            paths.append(plot_cell_sweeps(df, swept, out / f"hparam_{param}_cells.png", param))
        if law is not None:
            paths += [plot_hparam_law(law, out / f"hparam_{param}_vs_{x}.png", x) for x in against]
    return paths
