"""PNG plots of an experiment: loss curves, loss vs compute, LR sweeps, LR* vs size.

Figures are built with ``matplotlib.figure.Figure`` (Agg canvas), never pyplot, so plotting works
headless and leaves no global state behind in a notebook or a long-lived driver.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from trainer_core.analysis.fits import PowerLawFit
from trainer_core.analysis.load import ExperimentResults
from trainer_core.analysis.lr import LADDER_LR_EXPONENT, LRPowerLawFit, OptimalLR
from trainer_core.analysis.predict import ExtrapolationCheck


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(i / max(n - 1, 1) * 0.9) for i in range(n)]


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_loss_curves(results: ExperimentResults, path: str | Path, which: str = "both") -> Path:
    """Eval (markers) and/or train (thin lines) loss vs tokens, one colour per size, log x."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    sizes = list(results.runs.drop_duplicates("size")["size"])
    colors = dict(zip(sizes, _colors(len(sizes)), strict=True))
    labelled: set[str] = set()
    for _, m in results.metrics.groupby("name", sort=False):
        size = m["size"].iloc[0]
        label = None if size in labelled else size
        labelled.add(size)
        if which in ("train", "both"):
            t = m.dropna(subset=["train_loss"])
            ax.plot(
                t["tokens"], t["train_loss"], lw=0.8, alpha=0.6, color=colors[size], label=label
            )
            label = None
        if which in ("eval", "both"):
            e = m.dropna(subset=["eval_loss"])
            ax.plot(
                e["tokens"], e["eval_loss"], "o-", ms=3, lw=1.2, color=colors[size], label=label
            )
    ax.set_xscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss")
    ax.set_title(
        {"both": "train (lines) and eval (dots) loss", "eval": "eval loss", "train": "train loss"}[
            which
        ]
    )
    ax.legend(title="size", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_loss_vs_compute(
    points: pd.DataFrame,
    fit: PowerLawFit | None,
    path: str | Path,
    held_out: ExtrapolationCheck | None = None,
) -> Path:
    """Eval loss vs FLOPs per size, the fitted L(C), and the held-out size's actual vs predicted."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    sizes = list(points.sort_values("N").drop_duplicates("size")["size"])
    for size, color in zip(sizes, _colors(len(sizes)), strict=True):
        p = points[points["size"] == size]
        ax.scatter(p["flops"], p["eval_loss"], s=18, color=color, label=size, zorder=3)
    if fit is not None:
        lo, hi = points["flops"].min(), points["flops"].max()
        if held_out is not None:
            hi = max(hi, held_out.points["flops"].max())
        c = np.logspace(np.log10(lo) - 0.1, np.log10(hi) + 0.3, 200)
        ax.plot(
            c,
            fit.predict(c),
            "k--",
            lw=1,
            label=f"fit: {fit.E:.3g} + {fit.A:.3g} C^-{fit.alpha:.3f}",
        )
    if held_out is not None:
        h = held_out.points
        ax.scatter(
            h["flops"],
            h["actual"],
            s=70,
            facecolors="none",
            edgecolors="red",
            lw=1.5,
            label=f"held out {held_out.held_out_size}",
            zorder=4,
        )
        ax.scatter(
            h["flops"],
            h["predicted"],
            marker="*",
            s=90,
            color="red",
            label=f"predicted ({100 * held_out.rel_error:+.2f}% at the end)",
            zorder=5,
        )
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("eval loss")
    ax.set_title("loss vs compute")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_lr_sweep(
    table: pd.DataFrame,
    optima: dict[str, OptimalLR],
    path: str | Path,
    loss: str = "final_eval_loss",
) -> Path:
    """Loss vs peak LR per size (log x); optimum as a star, diverged trials as x at the top."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    sizes = list(table.sort_values("N").drop_duplicates("size")["size"])
    finite = table.loc[~table["diverged"], loss].astype(float)
    finite = finite[np.isfinite(finite)]
    top = finite.max() if len(finite) else 1.0
    for size, color in zip(sizes, _colors(len(sizes)), strict=True):
        t = table[table["size"] == size].sort_values("lr")
        ok = t[~t["diverged"]]
        ax.plot(ok["lr"], ok[loss], "o-", ms=4, color=color, label=size)
        bad = t[t["diverged"]]
        if len(bad):
            ax.scatter(bad["lr"], np.full(len(bad), top), marker="x", s=50, color=color, zorder=4)
        if size in optima:
            o = optima[size]
            ax.errorbar(
                [o.lr],
                [o.loss],
                xerr=[[o.lr - o.lr_low], [o.lr_high - o.lr]],
                fmt="*",
                ms=12,
                color=color,
                mec="k",
                zorder=5,
            )
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(loss.replace("_", " "))
    ax.set_title("LR sweep (star: optimum, x: diverged)")
    ax.legend(title="size", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_lr_vs_size(
    N: np.ndarray | list[float],
    lr_opt: np.ndarray | list[float],
    fit: LRPowerLawFit | None,
    path: str | Path,
    lr_err: tuple[list[float], list[float]] | None = None,
) -> Path:
    """Optimal LR vs N (log-log) with the fitted power law and the ladder's N^-1/3 reference.

    ``lr_err``: optional (lows, highs) drawn as error bars.
    """
    n, lr = np.asarray(N, dtype=float), np.asarray(lr_opt, dtype=float)
    fig = Figure(figsize=(6, 4.5))
    ax = fig.add_subplot()
    yerr = None if lr_err is None else [lr - np.asarray(lr_err[0]), np.asarray(lr_err[1]) - lr]
    ax.errorbar(n, lr, yerr=yerr, fmt="o", color="C0", label="optimal LR", zorder=3)
    grid = np.logspace(np.log10(n.min()) - 0.2, np.log10(n.max()) + 0.5, 100)
    if fit is not None:
        ax.plot(grid, fit.predict(grid), "C0--", label=f"fit: N^{fit.b:.3f}")
    # The reference goes through the data's geometric centre so only the slopes are compared.
    n0, lr0 = np.exp(np.log(n).mean()), np.exp(np.log(lr).mean())
    ax.plot(
        grid,
        lr0 * (grid / n0) ** LADDER_LR_EXPONENT,
        ":",
        color="gray",
        label="ladder default N^-1/3",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("optimal peak LR")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)
