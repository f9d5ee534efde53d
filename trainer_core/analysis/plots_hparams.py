"""PNG plots of the hyperparameter laws: the sweep per (N, D) cell with its fitted optimum, LR*
against N and against D with the law, B* against D.

Figures are ``matplotlib.figure.Figure`` objects (no pyplot), as in ``plots.py``: a ``plot_*``
function saves the Figure its ``*_figure`` twin builds, so tests check what is drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogLocator, NullFormatter

from trainer_core.analysis.hparam_laws import SYMBOL, CellOptimum, HparamLawFit, Param
from trainer_core.analysis.labels import compact
from trainer_core.analysis.plots import (
    CompactLogFormatter,
    beside,
    colors,
    draw_optimum,
    figure_axes,
    save,
)

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


RATIO_TOLERANCE = 1.15
"""Cells whose tokens per parameter D/N lie within this factor of each other are at one horizon:
a sweep sets its horizons in D/N, each size's D rounded to whole batches (3% apart on the demo's
sweep), and its horizons lie 2x or more apart."""


@dataclass(frozen=True)
class LawGroup:
    """Cells drawn in one colour with the law's line through them: those at one value of the
    variable off the x axis (``by`` "N" or "D"), or at one tokens per parameter (``by`` "D/N")."""

    by: str
    value: float
    cells: list[CellOptimum]

    @property
    def label(self) -> str:
        return f"{self.by}={compact(self.value)}"

    def varies(self, law: HparamLawFit) -> bool:
        """The law moves with what the group fixes (at fixed D/N, with D): a line per group."""
        return ("D" if self.by == "D/N" else self.by) in law.terms

    def at(self, x: str, along: float) -> tuple[float, float]:
        """(N, D) of the point ``along`` the x axis (``x``: "N" or "D") in this group."""
        if self.by == "D/N":
            return along, along * self.value
        return (along, self.value) if x == "N" else (self.value, along)


def law_groups(cells: list[CellOptimum], x: str) -> list[LawGroup]:
    """The cells' groups along ``x``: one per value of the other variable, or, against N, one
    per D/N where that makes fewer groups. A ladder-style sweep gives each size its own D (its
    horizons are multiples of its Chinchilla tokens): grouped by D, every group is one point and
    its law a stub; grouped by D/N, each runs across the sizes."""
    other = "D" if x == "N" else "N"
    exact = _clusters(cells, lambda c: getattr(c, other), 1.0)
    if other == "D":
        ratios = _clusters(cells, lambda c: c.D / c.N, RATIO_TOLERANCE)
        if len(ratios) < len(exact):
            return [LawGroup("D/N", _geomean([c.D / c.N for c in g]), g) for g in ratios]
    return [LawGroup(other, getattr(g[0], other), g) for g in exact]


def _clusters(
    cells: list[CellOptimum], key: Callable[[CellOptimum], float], tolerance: float
) -> list[list[CellOptimum]]:
    """The cells in ascending ``key``, split where it passes ``tolerance`` times the first of
    its group (1: equal values only)."""
    groups: list[list[CellOptimum]] = []
    for cell in sorted(cells, key=key):
        if groups and key(cell) <= key(groups[-1][0]) * tolerance:
            groups[-1].append(cell)
        else:
            groups.append([cell])
    return groups


def _geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def _dodged(groups: list[LawGroup], x: str, lo: float, hi: float) -> list[np.ndarray]:
    """Each group's cells' positions along ``x``, those sharing a value set side by side
    (:func:`beside`, in group order), so that equal optima at one N do not hide each other."""
    shared: dict[float, list[tuple[int, int]]] = {}
    for g, group in enumerate(groups):
        for i, cell in enumerate(group.cells):
            shared.setdefault(getattr(cell, x), []).append((g, i))
    at = [np.array([getattr(c, x) for c in group.cells], dtype=float) for group in groups]
    for value, members in shared.items():
        for rank, (g, i) in enumerate(members):
            at[g][i] = beside(value, lo, hi, rank - (len(members) - 1) / 2)
    return at


def hparam_law_figure(law: HparamLawFit, x: str = "N", *, ax: Axes | None = None) -> Figure:
    """Cell optima against ``x`` ("N" or "D", log-log) with their 95% intervals, one colour per
    group (:func:`law_groups`: a value of the other variable, or a D/N), and the law: one dashed
    line per group when the law depends on the other variable, else a single line with its 95%
    band. Cells excluded from the fit (optimum at the grid's edge) are hollow, without a bar
    (:func:`draw_optimum`); optima sharing an ``x`` are set side by side (:func:`_dodged`). Every
    colour and style drawn is in the legend."""
    fitted = {id(c) for c in law.cells}
    cells = law.cells + law.excluded
    fig, ax = figure_axes(ax, (6.5, 4.5))
    groups = law_groups(cells, x)
    span = [getattr(c, x) for c in cells]
    lo, hi = min(span) / 1.3, max(span) * 1.3
    per_group = len(groups) > 1 and groups[0].varies(law)
    for group, color, at in zip(
        groups, colors(len(groups)), _dodged(groups, x, lo, hi), strict=True
    ):
        draw_optimum(
            ax,
            at,
            [c.value for c in group.cells],
            [c.low for c in group.cells],
            [c.high for c in group.cells],
            [id(c) not in fitted for c in group.cells],
            color=color,
            label=group.label,
        )
        if per_group:
            _line(ax, law, x, group, [getattr(c, x) for c in group.cells], color, band=False)
    if not per_group:
        _line(ax, law, x, groups[0], span, "k", band=True)
    ax.set_xscale("log")
    ax.set_yscale("log")
    # Counts as a ladder names them (20K, 400K): 3x10^4 and 4x10^4 ran together on a decade.
    ax.xaxis.set_major_formatter(CompactLogFormatter())
    ax.xaxis.set_minor_formatter(CompactLogFormatter())
    ax.set_xlabel("non-embedding parameters N" if x == "N" else "tokens D")
    ax.set_ylabel(f"optimal {LABEL[law.param]}")
    exps = " ".join(f"{t}^{law.exponents[t]:+.3f}" for t in law.terms)
    ax.set_title(f"{SYMBOL[law.param]} = {law.c:.3g} {exps}", fontsize=9)
    ax.legend(handles=_legend(ax, law, groups, per_group), fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return fig


def _legend(ax: Axes, law: HparamLawFit, groups: list[LawGroup], per_group: bool) -> list[Artist]:
    """The groups' markers, then a key to the other styles drawn: the hollow optima, and the
    law's line with its band or its dashed lines (one per group)."""
    handles = ax.get_legend_handles_labels()[0]
    if law.excluded:
        edge = "optimum at the grid's edge (not fitted)"
        hollow = Line2D([], [], ls="none", marker="o", color="gray", mfc="white", label=edge)
        handles.insert(len(groups), hollow)
    if per_group:
        by = groups[0].by
        handles.append(
            Line2D([], [], ls="--", lw=1, color="gray", label=f"{law.name} at each {by}")
        )
    return handles


def _line(
    ax: Axes, law: HparamLawFit, x: str, group: LawGroup, span: list[float], color: Any, band: bool
) -> None:
    """The law along ``x`` through ``group`` (:meth:`LawGroup.at`), a little past the data;
    with its 95% band and named in the legend where it is the only line."""
    grid = np.geomspace(min(span) / 1.3, max(span) * 1.3, 30)
    at = [law.predict(*group.at(x, g)) for g in grid]
    label = f"{law.name}, 95% band shaded" if band else None
    ax.plot(grid, [p[0] for p in at], "--", lw=1, color=color, label=label)
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
