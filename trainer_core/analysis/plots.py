"""PNG plots of an experiment: loss curves, LR sweeps, LR* vs size (scaling laws: plots_scaling).

Figures are built with ``matplotlib.figure.Figure`` (Agg canvas), never pyplot, so plotting works
headless and leaves no global state behind in a notebook or a long-lived driver. A ``plot_*``
function saves the Figure its ``*_figure`` twin builds, so tests check what is drawn, not a file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from trainer_core.analysis.labels import compact
from trainer_core.analysis.load import ExperimentResults
from trainer_core.analysis.lr import (
    COMPARED,
    LADDER_LR_EXPONENT,
    LRPowerLawFit,
    OptimalLR,
    batches_differ,
)


def colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(i / max(n - 1, 1) * 0.9) for i in range(n)]


def figure_axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """A new Figure of ``figsize`` with one Axes, or ``ax`` and the figure it is in: a
    one-panel ``*_figure`` function given ``ax`` draws into that panel of the caller's own
    figure (a notebook's ``plt.subplots``), and returns that figure."""
    if ax is None:
        fig = Figure(figsize=figsize)
        return fig, fig.add_subplot()
    fig = ax.figure
    while not isinstance(fig, Figure):  # a subfigure's panel: the figure holding it
        fig = fig.figure
    return fig, ax


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def interval_bars(ax, at, lo, hi, axis: str = "y", color=None, capsize: float = 3) -> None:
    """Bars from ``lo`` to ``hi`` (along ``axis``) at positions ``at``, drawn as the intervals
    themselves: an estimate can sit outside its interval (a percentile interval of skewed refits,
    a cell optimum's interval on a coarse grid), where errors relative to the marker come out
    negative and matplotlib refuses the whole plot. Non-finite bounds draw no bar."""
    at, lo, hi = (np.atleast_1d(np.asarray(v, dtype=float)) for v in (at, lo, hi))
    ok = np.isfinite(lo) & np.isfinite(hi)
    if not ok.any():
        return
    mid, half = (lo[ok] + hi[ok]) / 2, np.abs(hi[ok] - lo[ok]) / 2
    place = (at[ok], mid) if axis == "y" else (mid, at[ok])
    err = {"yerr": half} if axis == "y" else {"xerr": half}
    ax.errorbar(*place, **err, fmt="none", ecolor=color, capsize=capsize, zorder=3)


COMPUTE_LABEL = "compute C = 6ND (FLOPs, attention not counted)"
"""The x label of every plot against the analysis' compute (``analysis_flops``)."""

BESIDE = 0.025
"""How far (a fraction of the axis' decades) an estimate is moved off the x it shares with
another, so that neither hides the other's marker or interval."""


def beside(x: float, lo: float, hi: float, side: float) -> float:
    """``x`` on a log axis spanning ``lo``..``hi``, moved ``side`` steps of BESIDE (negative:
    left): a step in decades of the span is visible on any axis, a fixed % of x is not."""
    return float(x * (hi / lo) ** (BESIDE * side))


class CompactLogFormatter(LogFormatter):
    """Log-axis labels as :func:`compact` writes them, on the ticks matplotlib would label."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return compact(x) if super().__call__(x, pos) else ""


def draw_optimum(
    ax: Axes,
    at: float | np.ndarray | list[float],
    value: float | np.ndarray | list[float],
    low: float | np.ndarray | list[float],
    high: float | np.ndarray | list[float],
    at_edge: bool | np.ndarray | list[bool],
    axis: str = "y",
    color=None,
    marker: str = "o",
    ms: float = 6,
    label: str | None = None,
) -> None:
    """Optima ``value`` at positions ``at``, their intervals from ``low`` to ``high`` along
    ``axis``, drawn one way in every figure: filled with the interval's bar, or, at the edge of
    the grid, hollow with no bar (the optimum is a bound and its interval open on one side:
    half a bar would read as a measured interval). ``label`` names the filled markers, or the
    hollow ones where none is filled."""
    at, value, low, high = (
        np.atleast_1d(np.asarray(v, dtype=float)) for v in (at, value, low, high)
    )
    edge = np.broadcast_to(np.asarray(at_edge, dtype=bool), at.shape)
    inside = ~edge
    interval_bars(ax, at[inside], low[inside], high[inside], axis, color, capsize=0)
    for which, face, edge_colour in ((inside, color, "k"), (edge, "white", color)):
        if which.any():
            xy = (at[which], value[which]) if axis == "y" else (value[which], at[which])
            ax.plot(
                *xy, marker, ms=ms, color=color, mfc=face, mec=edge_colour, label=label, zorder=5
            )
            label = None


def plot_loss_curves(results: ExperimentResults, path: str | Path, which: str = "both") -> Path:
    """Write :func:`loss_curves_figure` to a PNG at ``path``."""
    return save(loss_curves_figure(results, which), path)


def loss_curves_figure(
    results: ExperimentResults, which: str = "both", *, ax: Axes | None = None
) -> Figure:
    """Eval (markers) and/or train (thin lines) loss vs tokens, one colour per size, log x
    (``ax``: drawn into that panel of your figure, :func:`figure_axes`)."""
    fig, ax = figure_axes(ax, (7, 4.5))
    sizes = list(results.runs.drop_duplicates("size")["size"])
    by_size = dict(zip(sizes, colors(len(sizes)), strict=True))
    labelled: set[str] = set()
    for _, m in results.metrics.groupby("name", sort=False):
        size = m["size"].iloc[0]
        label = None if size in labelled else size
        labelled.add(size)
        if which in ("train", "both"):
            t = m.dropna(subset=["train_loss"])
            ax.plot(
                t["tokens"], t["train_loss"], lw=0.8, alpha=0.6, color=by_size[size], label=label
            )
            label = None
        if which in ("eval", "both"):
            e = m.dropna(subset=["eval_loss"])
            ax.plot(
                e["tokens"], e["eval_loss"], "o-", ms=3, lw=1.2, color=by_size[size], label=label
            )
    ax.set_xscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss")
    ax.set_title(
        {"both": "train (lines) and eval (dots) loss", "eval": "eval loss", "train": "train loss"}[
            which
        ]
    )
    if labelled:
        ax.legend(title="size", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


def plot_lr_sweep(
    table: pd.DataFrame,
    optima: dict[str, OptimalLR],
    path: str | Path,
    loss: str = COMPARED,
) -> Path:
    """Write :func:`lr_sweep_figure` to a PNG at ``path``."""
    return save(lr_sweep_figure(table, optima, loss), path)


BATCH_STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", (0, (5, 1, 1, 1)))]
"""(marker, line style) of a size's batches, smallest first, where a sweep tried several."""


def lr_sweep_figure(
    table: pd.DataFrame,
    optima: dict[str, OptimalLR],
    loss: str = COMPARED,
    *,
    ax: Axes | None = None,
) -> Figure:
    """Loss vs peak LR per size (log x) at the size's common step; the optimum as a star
    (:func:`draw_optimum`: hollow at the grid's edge), trials stopped early as hollow markers
    labelled with their last step (at the top when stopped before the common step: judged
    worse, no loss there), diverged as x.

    Where a size tried several batches, one line per (size, batch): colour the size, marker
    and line style the batch (its rank among the size's), compared at the group's common
    tokens (their steps differ), each size's optimum the best over its batches."""
    fig, ax = figure_axes(ax, (7.5, 5))
    sizes = list(table.sort_values("N").drop_duplicates("size")["size"])
    finite = table.loc[~table["diverged"], loss].astype(float)
    finite = finite[np.isfinite(finite)]
    # Trials without a loss to draw (stopped before the end, diverged) sit in a band above.
    top = finite.max() + 0.05 * (np.ptp(finite) or abs(finite.max())) if len(finite) else 1.0
    by_batch = batches_differ(table)
    for size, color in zip(sizes, colors(len(sizes)), strict=True):
        t = table[table["size"] == size]
        batches = sorted(t["batch"].unique())
        for rank, batch in enumerate(batches):
            style = BATCH_STYLES[rank % len(BATCH_STYLES)]
            rows = t[t["batch"] == batch].sort_values("lr")
            _lr_sweep_line(ax, rows, loss, color, style, top, by_batch)
        if size in optima:
            o = optima[size]
            draw_optimum(
                ax, o.loss, o.lr, o.lr_low, o.lr_high, o.at_edge, "x", color, marker="*", ms=12
            )
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    common = "tokens" if by_batch else "step"
    what = f"eval loss at the common {common}" if loss == COMPARED else loss.replace("_", " ")
    ax.set_ylabel(what)
    ax.set_title(
        "LR sweep: star the optimum (hollow: at the grid's edge, a bound)\n"
        "hollow markers: stopped early; x: diverged\n"
        "on the top line: no loss at the common point, judged worse",
        fontsize=10,
    )
    ax.legend(title="size, batch (tokens)" if by_batch else "size", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


def _lr_sweep_line(
    ax: Axes, t: pd.DataFrame, loss: str, color: tuple, style: tuple, top: float, by_batch: bool
) -> None:
    """One size's trials at one batch: the line, its finished, stopped and diverged trials."""
    mark, dash = style
    ok = t[~t["diverged"] & np.isfinite(t[loss].astype(float))]
    size = t["size"].iloc[0]
    name = f"{size}, {t['batch'].iloc[0]:,}" if by_batch else size
    label = name
    if loss == COMPARED and len(ok):
        if by_batch:
            label = f"{name} (at {ok['compared_tokens'].max():.4g} tokens)"
        elif pd.notna(ok["compared_step"].max()):
            label = f"{name} (at step {ok['compared_step'].max()})"
    on_line = {"marker": mark, "ms": 4} if by_batch else {}  # the legend shows the batch's
    ax.plot(ok["lr"], ok[loss], linestyle=dash, lw=1, color=color, label=label, **on_line)
    done = ok[~ok["stopped_early"]]
    ax.scatter(done["lr"], done[loss], s=22, marker=mark, color=color, zorder=3)
    stopped = t[~t["diverged"] & t["stopped_early"] & t[loss].astype(float).notna()]
    at = np.where(np.isfinite(stopped[loss].astype(float)), stopped[loss], top)
    ax.scatter(stopped["lr"], at, s=40, marker=mark, facecolors="white", edgecolors=color, zorder=3)
    for row, y in zip(stopped.itertuples(index=False), at, strict=True):
        ax.annotate(
            f"stopped@{row.steps_run}",
            (row.lr, y),
            textcoords="offset points",
            xytext=(0, 7),
            ha="center",
            fontsize=6,
            color=color,
        )
    bad = t[t["diverged"]]
    if len(bad):
        ax.scatter(bad["lr"], np.full(len(bad), top), marker="x", s=50, color=color, zorder=4)


def plot_lr_vs_size(
    N: np.ndarray | list[float],
    lr_opt: np.ndarray | list[float],
    fit: LRPowerLawFit | None,
    path: str | Path,
    lr_err: tuple[list[float], list[float]] | None = None,
    at_edge: list[bool] | None = None,
    centre: np.ndarray | list[float] | None = None,
) -> Path:
    """Write :func:`lr_vs_size_figure` to a PNG at ``path``."""
    return save(lr_vs_size_figure(N, lr_opt, fit, lr_err, at_edge, centre), path)


def grid_centres(runs: pd.DataFrame) -> dict[str, float]:
    """Each size's grid centre, the LR its factor 1 had (the config's LR rule), from a sweep's
    runs (``ExperimentResults.runs``): a trial's peak LR over its ``lr_factor`` tag. Sizes
    whose trials carry no factor (older sweeps) are left out."""
    if "tag_lr_factor" not in runs.columns:
        return {}
    tagged = runs[runs["tag_lr_factor"].notna()]
    centre = tagged["peak_lr"].astype(float) / tagged["tag_lr_factor"].astype(float)
    return {str(size): float(v) for size, v in centre.groupby(tagged["size"]).median().items()}


def lr_vs_size_figure(
    N: np.ndarray | list[float],
    lr_opt: np.ndarray | list[float],
    fit: LRPowerLawFit | None,
    lr_err: tuple[list[float], list[float]] | None = None,
    at_edge: list[bool] | None = None,
    centre: np.ndarray | list[float] | None = None,
    *,
    ax: Axes | None = None,
) -> Figure:
    """Optimal LR vs N (log-log) with the fitted power law, the sweep's grid centre per size and
    the reference exponent's slope.

    ``lr_err``: optional (lows, highs) drawn as error bars; ``at_edge``: which optima sit at
    their grid's edge, drawn hollow without a bar (:func:`draw_optimum`); ``centre``: the LR
    each size's grid was centred on (:func:`grid_centres`), drawn so that a fit which only
    returns the grid's own rule (optima at the grid's centre) shows as that, not as a finding.
    """
    n, lr = np.asarray(N, dtype=float), np.asarray(lr_opt, dtype=float)
    fig, ax = figure_axes(ax, (6, 4.5))
    low, high = lr_err if lr_err is not None else (np.full_like(n, np.nan),) * 2
    edge = at_edge if at_edge is not None else False
    draw_optimum(ax, n, lr, low, high, edge, color="C0", label="optimal LR")
    grid = np.logspace(np.log10(n.min()) - 0.2, np.log10(n.max()) + 0.5, 100)
    if fit is not None:
        ax.plot(grid, fit.predict(grid), "C0--", label=f"fit: N^{fit.b:.3f}")
    if centre is not None:
        _grid_centre(ax, n, np.asarray(centre, dtype=float))
    _reference(ax, n, lr, grid, fit.reference_exponent if fit is not None else LADDER_LR_EXPONENT)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("optimal peak LR")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


def _grid_centre(ax: Axes, n: np.ndarray, centre: np.ndarray) -> None:
    """The LR each size's grid was centred on (NaN: not known, not drawn), labelled with its
    slope in N: a fit of the same slope through optima on these points measured the grid, not
    the optimum."""
    known = np.isfinite(centre)
    n, centre = n[known], centre[known]
    if not n.size:
        return
    order = np.argsort(n)
    label = "sweep grid's centre (factor 1)"
    if np.unique(n).size >= 2:
        label += f": N^{np.polyfit(np.log(n), np.log(centre), 1)[0]:.3f}"
    ax.plot(n[order], centre[order], "s-", ms=10, lw=1, color="C1", mfc="none", label=label)


def _reference(ax: Axes, n: np.ndarray, lr: np.ndarray, grid: np.ndarray, exponent: float) -> None:
    """A line of the reference exponent's slope (OLMo's, the ladder's default rule) through the
    optima's geometric centre: it compares slopes only, its height is the data's."""
    n0, lr0 = np.exp(np.log(n).mean()), np.exp(np.log(lr).mean())
    ax.plot(
        grid,
        lr0 * (grid / n0) ** exponent,
        ":",
        color="gray",
        label=f"N^{exponent:.3f} slope (OLMo's rule), for comparison",
    )
