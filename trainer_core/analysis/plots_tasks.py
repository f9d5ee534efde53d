"""The two-step task prediction at a glance: one two-panel PNG per task.

Left, step 1: its points' task loss (each run's final one, or every annealed one) against
compute, the fitted law along each size, and the prediction at the target (or held-out) size
with its 95% interval. Right, step 2: accuracy against task loss at every point, the fitted
sigmoid, and the chained prediction with both intervals, so a reader sees how far each step
extrapolates.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from trainer_core.analysis.ladder_table import TASK_LOSS_SUFFIX
from trainer_core.analysis.plots import colors, interval_bars, save
from trainer_core.analysis.tasks import TaskLaw, TaskPrediction, step1_points


def plot_task_prediction(
    law: TaskLaw,
    points: pd.DataFrame,
    predictions: list[TaskPrediction],
    path: str | Path,
    final_only: bool = True,
) -> Path:
    """Write :func:`task_prediction_figure` to a PNG at ``path``."""
    return save(task_prediction_figure(law, points, predictions, final_only), path)


def task_prediction_figure(
    law: TaskLaw,
    points: pd.DataFrame,
    predictions: list[TaskPrediction],
    final_only: bool = True,
) -> Figure:
    """The two panels of ``law`` (fitted on ``points``, ``final_only`` as in :func:`fit_task`)
    and its ``predictions``; a bare Figure, as in ``plots.py``, so nothing is left to close."""
    loss_col, acc_col = law.task + TASK_LOSS_SUFFIX, f"{law.task}/{law.accuracy}"
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    sizes = sorted(points["N"].unique())
    final = step1_points(points, final_only)
    for color, n in zip(colors(len(sizes)), sizes, strict=True):
        runs = final[final["N"] == n]
        left.scatter(6 * n * runs["tokens"], runs[loss_col], color=color, s=18, label=f"N={n:.3g}")
        d = np.geomspace(runs["tokens"].min(), runs["tokens"].max(), 30)
        left.plot(6 * n * d, [law.predict_loss(n, x) for x in d], color=color, lw=1)
        sub = points[points["N"] == n]
        right.scatter(sub[loss_col], sub[acc_col], color=color, s=6, alpha=0.5)
    for pred in predictions:
        _draw_prediction(left, right, law, pred)
    left.set(xscale="log", xlabel="compute 6ND (FLOPs)", ylabel="task loss (bits per byte)")
    left.set_title(f"{law.task}: step 1, task loss vs compute")
    left.legend(fontsize=7)
    lo = min([points[loss_col].min(), *(p.loss_interval[0] for p in predictions if _ok(p))])
    hi = points[loss_col].max()
    grid = np.linspace(lo - 0.05 * (hi - lo), hi, 200)
    right.plot(grid, law.step2.predict(grid), color="black", lw=1.2, label="sigmoid fit")
    right.axhline(law.step2.chance, color="grey", ls=":", lw=1, label="chance")
    right.set(xlabel="task loss (bits per byte)", ylabel=f"accuracy ({law.accuracy})")
    right.set_title(f"{law.task}: step 2, accuracy vs task loss")
    right.legend(fontsize=7)
    return fig


def _ok(pred: TaskPrediction) -> bool:
    return all(math.isfinite(v) for v in pred.loss_interval)


def _draw_prediction(left, right, law: TaskLaw, pred: TaskPrediction) -> None:
    """The target size's law over the last decade of its tokens, its predicted point with the
    interval, and the measured point where known."""
    d = np.geomspace(pred.D / 10, pred.D, 40)
    c = 6 * pred.N * pred.D
    left.plot(6 * pred.N * d, [law.predict_loss(pred.N, x) for x in d], color="red", lw=1, ls="--")
    interval_bars(left, c, *pred.loss_interval, color="red")
    left.plot([c], [pred.loss], "o", color="red", label=pred.at)
    interval_bars(right, pred.acc, *pred.loss_interval, axis="x", color="red")
    interval_bars(right, pred.loss, *pred.acc_interval, color="red")
    right.plot([pred.loss], [pred.acc], "o", color="red", label=f"predicted {pred.at}")
    if math.isfinite(pred.measured_acc):
        left.scatter(c, pred.measured_loss, marker="*", s=90, color="black", zorder=5)
        right.scatter(pred.measured_loss, pred.measured_acc, marker="*", s=90, color="black")
