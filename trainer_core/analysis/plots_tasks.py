"""The two-step task prediction at a glance: one two-panel PNG per task.

Left, step 1: its points' task loss (each run's final one, or every annealed one) against
compute, the fitted law along each size, and the prediction at the target (or held-out) size
with its 95% interval, drawn beside the measured star. Right, step 2: accuracy against task
loss at every point, the fitted sigmoid, and the chained prediction with both intervals, so a
reader sees how far each step extrapolates.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from trainer_core.analysis.bootstrap import CI_LEVEL
from trainer_core.analysis.labels import compact
from trainer_core.analysis.ladder_table import TASK_LOSS_SUFFIX
from trainer_core.analysis.plots import (
    COMPUTE_LABEL,
    beside,
    colors,
    interval_bars,
    save,
)
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
        label = f"N={compact(n)}"
        left.scatter(6 * n * runs["tokens"], runs[loss_col], color=color, s=18, label=label)
        d = np.geomspace(runs["tokens"].min(), runs["tokens"].max(), 30)
        left.plot(6 * n * d, [law.predict_loss(n, x) for x in d], color=color, lw=1)
        sub = points[points["N"] == n]
        right.scatter(sub[loss_col], sub[acc_col], color=color, s=6, alpha=0.5)
    span = _compute_span(final, predictions)
    for pred in predictions:
        _draw_prediction(left, right, law, pred, span)
    left.set(xscale="log", xlabel=COMPUTE_LABEL, ylabel="task loss (bits per byte)")
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


def _compute_span(final: pd.DataFrame, predictions: list[TaskPrediction]) -> tuple[float, float]:
    """The compute the left panel's data spans: the points and each prediction's law."""
    c = [
        *(6 * final["N"] * final["tokens"]),
        *(6 * p.N * p.D * f for p in predictions for f in (0.1, 1)),
    ]
    return min(c), max(c)


def _draw_prediction(
    left: Axes, right: Axes, law: TaskLaw, pred: TaskPrediction, span: tuple[float, float]
) -> None:
    """The target size's law over the last decade of its tokens, its predicted point with the
    interval, and the measured star where known; on the left the prediction is drawn beside the
    star (``span``: the panel's compute), which hid it at the same C."""
    name = f"N={compact(pred.N)}, D={compact(pred.D)}"
    predicted = f"{name} predicted ({100 * CI_LEVEL:.0f}% interval)"
    d = np.geomspace(pred.D / 10, pred.D, 40)
    c = 6 * pred.N * pred.D
    curve = (6 * pred.N * d, [law.predict_loss(pred.N, x) for x in d])
    left.plot(*curve, color="red", lw=1, ls="--", label=f"{name}: step-1 law, extrapolated")
    # clear of the star's width where there is one; the end of its law shows C
    at = beside(c, *span, side=2) if math.isfinite(pred.measured_acc) else c
    interval_bars(left, at, *pred.loss_interval, color="red")
    left.plot([at], [pred.loss], "o", color="red", mec="k", zorder=6, label=predicted)
    interval_bars(right, pred.acc, *pred.loss_interval, axis="x", color="red")
    interval_bars(right, pred.loss, *pred.acc_interval, color="red")
    right.plot([pred.loss], [pred.acc], "o", color="red", mec="k", zorder=6, label=predicted)
    if math.isfinite(pred.measured_acc):
        measured = f"{name} measured"
        star = {"marker": "*", "s": 90, "color": "black", "zorder": 5, "label": measured}
        left.scatter(c, pred.measured_loss, **star)
        right.scatter(pred.measured_loss, pred.measured_acc, **star)
