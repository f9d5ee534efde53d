"""Downstream-task prediction in two steps (Bhagia et al. 2024, "Establishing Task Scaling Laws
via Compute-Efficient Model Ladders"), with intervals that carry both steps' uncertainty.

Accuracy is not a power law in (N, D): it sits near chance, then climbs and saturates. The task
loss (bits per byte of the gold continuation) is. So step 1 fits the task loss against (N, D)
with the Chinchilla form (or against compute), and step 2 maps task loss to accuracy with a
sigmoid:

    acc(L) = floor + (ceiling - floor) / (1 + exp(k (L - L0)))

(the paper's a / (1 + exp(-k (L - L0))) + b with k > 0 and a < 0: b = ceiling, the accuracy as
the loss falls, and a = floor - ceiling). The ceiling is 1 and the floor is fitted unless asked
otherwise (see :func:`~trainer_core.analysis.task_sigmoid.fit_sigmoid`, which says why a ceiling
of 1 is the paper's method in effect); the floor, because a metric's bottom is seldom at chance:
it can plateau above it (the demo's calibrated accuracy) or, biased towards some choices, sit
below it (length-normalised ARC-Challenge on OLMo's small models). Step 1's bootstrap is the
residual resampling by size of ``fits.py``; step 2's resamples points. A prediction pairs the
i-th refit of each step, so its interval holds both steps' spread, and has none when either
step has no refits.

A task not scored at some points (added to a ladder's evals after its first sizes ran, or an
eval that failed) is fitted without them, with a flag naming the sizes; a task that cannot be
fitted is skipped alone, the other tasks predicted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trainer_core.analysis.bootstrap import percentile_interval
from trainer_core.analysis.checks import fit_flags, unresolved
from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.fits import (
    ChinchillaFit,
    PowerLawFit,
    fit_chinchilla,
    fit_loss_vs_compute,
)
from trainer_core.analysis.ladder_table import (
    AUTO,
    EXAMPLES_SUFFIX,
    TASK_LOSS_SUFFIX,
    accuracy_metric,
)
from trainer_core.analysis.load import analysis_flops
from trainer_core.analysis.task_sigmoid import SigmoidFit, fit_sigmoid, sigmoid_flags

STEP1_ND = "N, D"
STEP1_COMPUTE = "compute"
# -- both steps -----------------------------------------------------------------------------------


@dataclass
class TaskPrediction(ShownAsText):
    """One task's two-step prediction at (N, D), beside the measured values when known."""

    task: str
    at: str
    N: float
    D: float
    loss: float
    loss_interval: tuple[float, float]
    acc: float
    acc_interval: tuple[float, float]
    measured_loss: float = math.nan
    measured_acc: float = math.nan
    flags: list[str] = field(default_factory=list)
    examples: int = 0
    """When > 0, ``acc_interval`` is for an accuracy *measured* on this many examples: the fits'
    spread plus the binomial noise of the measurement, the fair band to hold a measured value to."""
    accuracy: str = "acc"
    """Which accuracy (``acc``, ``acc_norm``, ``acc_pmi``) step 2 fitted and ``acc`` predicts."""
    acc_at_measured_loss: float = math.nan
    """Step 2 alone: the sigmoid at the measured task loss, to tell the steps' errors apart."""
    no_interval: str = ""
    """Why ``acc_interval`` is NaN though a bootstrap was asked for; empty otherwise."""

    @property
    def acc_error(self) -> float:
        """Predicted minus measured accuracy (absolute, in accuracy units): both steps."""
        return self.acc - self.measured_acc

    @property
    def loss_error(self) -> float:
        """Step 1 alone: predicted minus measured task loss, relative."""
        return self.loss / self.measured_loss - 1

    @property
    def step2_error(self) -> float:
        """Step 2 alone: its accuracy at the measured task loss minus the measured accuracy."""
        return self.acc_at_measured_loss - self.measured_acc

    @property
    def covers(self) -> bool:
        lo, hi = self.acc_interval
        return lo <= self.measured_acc <= hi

    def row(self) -> str:
        lo, hi = self.loss_interval
        alo, ahi = self.acc_interval
        line = (
            f"{self.task:<16} {self.accuracy:<8} {self.at:<12} {self.loss:7.4f} [{lo:.4f}, {hi:.4f}]"
            f"  {self.acc:6.3f} [{alo:.3f}, {ahi:.3f}]"
        )
        if math.isfinite(self.measured_acc):
            line += (
                f"  {self.measured_loss:7.4f}  {self.measured_acc:6.3f}"
                f"  {100 * self.acc_error:+6.1f}"
                f"  {100 * self.loss_error:+6.1f}%  {100 * self.step2_error:+6.1f}"
            )
        if self.flags:
            line += "  (!)"
        return line

    def __str__(self) -> str:
        return self.row()


TABLE_HEADER = (
    f"{'task':<16} {'accuracy':<8} {'at':<12} {'task loss [95% CI]':<26}  {'acc [95% CI]':<22}"
    f"  {'meas L':>7}  {'meas':>6}  {'err pt':>6}  {'step 1':>7}  {'step 2':>6}"
)
TABLE_NOTE = (
    "  err pt: predicted - measured accuracy, in points; step 1: the task loss's error; step 2: "
    "the sigmoid at the measured task loss - the measured accuracy, in points; (!): the task's "
    "fit carries a flag, given with it"
)


@dataclass
class TaskReport(ShownAsText):
    """Predictions of several tasks, printed as a table; flags follow under it. ``laws``: the
    fits behind them by task, for the plots."""

    predictions: list[TaskPrediction]
    title: str = "two-step task prediction"
    laws: dict[str, TaskLaw] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    """The tasks that could not be fitted, each line naming its task and why."""

    def __str__(self) -> str:
        lines = [self.title, TABLE_HEADER, *(p.row() for p in self.predictions)]
        measured = [p for p in self.predictions if math.isfinite(p.measured_acc)]
        if measured:
            lines.append(TABLE_NOTE)
        # without a bootstrap there is no interval to miss
        bounded = [p for p in measured if all(map(math.isfinite, p.acc_interval))]
        lines.extend(_miss(p) for p in bounded if not p.covers)
        counts = sorted({p.examples for p in self.predictions if p.examples})
        if counts:
            lines.append(
                f"  acc intervals are for a score on {', '.join(map(str, counts))} examples "
                "(the fits' spread plus the measurement's binomial noise)"
            )
        flags = {(p.task, flag): None for p in self.predictions for flag in p.flags}
        flags.update({(p.task, p.no_interval): None for p in self.predictions if p.no_interval})
        lines.extend(f"  {task}, {flag}" for task, flag in flags)
        lines.extend(f"  skipped {why}" for why in self.skipped)
        return "\n".join(lines)


def _miss(p: TaskPrediction) -> str:
    """What a measured accuracy outside its interval says: which step carries the error."""
    lo, hi = p.acc_interval
    if abs(p.step2_error) >= abs(p.acc_error) / 2:
        why = (
            "step 2 carries it: at equal task loss this size scores "
            f"{'lower' if p.step2_error > 0 else 'higher'} than the sizes the sigmoid was fitted on"
        )
    else:
        why = "step 1 carries it: the task loss itself was mispredicted"
    return (
        f"  MISS: {p.task} at {p.at}: measured {p.accuracy} {p.measured_acc:.3f} is outside "
        f"[{lo:.3f}, {hi:.3f}]; {why}"
    )


@dataclass
class TaskLaw(ShownAsText):
    """Both steps of one task: task loss vs (N, D) or compute, accuracy vs task loss."""

    task: str
    step1: ChinchillaFit | PowerLawFit
    step2: SigmoidFit
    flags: list[str] = field(default_factory=list)
    accuracy: str = "acc"
    """The accuracy column step 2 was fitted to: ``<task>/<accuracy>``."""
    final_only: bool = True
    """Step 1 fitted each run's last point only (False: every point): :func:`step1_points`."""

    def predict_loss(self, N: float, D: float) -> float:
        if isinstance(self.step1, ChinchillaFit):
            return float(self.step1.predict(N, D))
        return float(self.step1.predict(analysis_flops(N, D)))

    def loss_samples(self, N: float, D: float) -> np.ndarray:
        """Step 1's bootstrap predictions at (N, D), as the law itself makes them (a frontier's
        refits moved onto it where they were drawn around another law)."""
        if isinstance(self.step1, ChinchillaFit):
            return self.step1.predict_samples(N, D)
        return self.step1.predict_samples(analysis_flops(float(N), float(D)))

    def predict(
        self,
        N: float,
        D: float,
        at: str = "",
        measured_loss: float = math.nan,
        measured_acc: float = math.nan,
        examples: int = 0,
    ) -> TaskPrediction:
        """Point prediction from the full-data fits; the interval from the paired refits, with
        each refit's accuracy drawn as a score on ``examples`` examples when that is > 0."""
        loss = self.predict_loss(N, D)
        l_samples = self.loss_samples(N, D)
        n = min(l_samples.size, self.step2.n_bootstrap)
        acc_samples = self.step2.predict_samples(l_samples[:n]) if n else np.empty(0)
        no_interval = NO_STEP1_INTERVAL if self.step2.n_bootstrap and not n else ""
        if examples > 0 and acc_samples.size:
            rng = np.random.default_rng(len(acc_samples))
            acc_samples = rng.binomial(examples, np.clip(acc_samples, 0.0, 1.0)) / examples
        at_measured = (
            float(self.step2.predict(measured_loss)) if math.isfinite(measured_loss) else math.nan
        )
        return TaskPrediction(
            self.task,
            at or f"N={N:.3g}",
            float(N),
            float(D),
            loss,
            percentile_interval(l_samples),
            float(self.step2.predict(loss)),
            percentile_interval(acc_samples),
            measured_loss,
            measured_acc,
            list(self.flags),
            int(examples),
            self.accuracy,
            at_measured,
            no_interval,
        )

    def __str__(self) -> str:
        lines = [
            f"task {self.task}: step 1",
            self.step1.describe(flags=False),
            f"step 2 ({self.accuracy})",
            str(self.step2),
        ]
        lines.extend(f"  {flag}" for flag in self.flags)
        return "\n".join(lines)


NO_STEP1_INTERVAL = (
    "no 95% acc interval: step 1 has no bootstrap refits (its flag says why), and the chained "
    "interval needs both steps' spread (step 2's alone would claim a precision the fits lack)"
)


def final_points(points: pd.DataFrame) -> pd.DataFrame:
    """Each run's last eval (most tokens): step 1's points, since a run's earlier checkpoints
    sit above the loss a run of that length would reach (its LR has not decayed yet)."""
    idx = points.groupby("name", sort=False)["tokens"].idxmax()
    return points.loc[idx].reset_index(drop=True)


def every_point_annealed(points: pd.DataFrame) -> bool:
    """Whether ``points`` says each of its evals is annealed (its ``annealed`` column, as
    ``task_points()`` gives a ladder whose decays have run); a ladder table has no such column."""
    return "annealed" in points and bool(points["annealed"].eq(True).all())


def step1_points(points: pd.DataFrame, final_only: bool | None = None) -> pd.DataFrame:
    """Step 1's points: each run's last one, or all of them, since a WSD-S ladder's annealed
    evals each stand for a finished run of that length. ``None``: all of them when
    :func:`every_point_annealed`, else each run's last (a table of published checkpoints)."""
    if final_only is None:
        final_only = not every_point_annealed(points)
    return final_points(points) if final_only else points.reset_index(drop=True)


def task_rows(points: pd.DataFrame, task: str, accuracy: str) -> tuple[pd.DataFrame, str]:
    """The points that scored ``task`` (a finite task loss and ``accuracy``), and which sizes
    have points that did not ("" when none): a task added to a ladder's evals after its first
    sizes ran, or an eval that failed, leaves them blank."""
    columns = [task + TASK_LOSS_SUFFIX, f"{task}/{accuracy}"]
    ok = np.isfinite(points[columns].to_numpy(float)).all(axis=1)
    if ok.all():
        return points, ""
    total = points.groupby("size", sort=False).size()
    lacking = points[~ok].groupby("size", sort=False).size()
    sizes = points.drop_duplicates("size").sort_values("N")["size"]
    where = [
        f"{s} ({'every point' if lacking[s] == total[s] else f'{lacking[s]} of {total[s]} points'})"
        for s in sizes
        if s in lacking
    ]
    return points[ok], f"no finite {' / '.join(columns)} at {', '.join(where)}"


def fit_task(
    points: pd.DataFrame,
    task: str,
    chance: float,
    step1: str = STEP1_ND,
    n_bootstrap: int = 200,
    seed: int = 0,
    ceiling: float | None = 1.0,
    final_only: bool | None = None,
    accuracy: str = AUTO,
    floor: float | None = None,
) -> TaskLaw:
    """Both steps of ``task`` on a points table (``ladder_table`` / ``fit_points`` /
    ``task_points()`` columns plus ``<task>/bpb`` and an accuracy, picked by
    :func:`accuracy_metric`): step 1 on :func:`step1_points` (``final_only`` as there: by
    default every point of a ladder's annealed evals, each run's last of a table), grouped by
    size; step 2 on every point. Points without the task's loss or accuracy are left out, with
    a flag (:func:`task_rows`). Both bootstraps draw ``n_bootstrap`` refits, paired in
    predictions. A fit the points cannot support raises an error naming the task."""
    loss_col = task + TASK_LOSS_SUFFIX
    missing = [c for c in ("size", "name", "N", "tokens", loss_col) if c not in points]
    if missing:
        raise AnalysisError(f"task {task!r}: the points have no column {', '.join(missing)}")
    accuracy = accuracy_metric(points, task, accuracy)
    acc_col = f"{task}/{accuracy}"
    if final_only is None:
        final_only = not every_point_annealed(points)
    points, gaps = task_rows(points, task, accuracy)
    final = step1_points(points, final_only)
    try:
        if step1 == STEP1_ND:
            law = fit_chinchilla(
                final["N"], final["tokens"], final[loss_col], n_bootstrap, seed, final["size"]
            )
        elif step1 == STEP1_COMPUTE:
            flops = analysis_flops(final["N"], final["tokens"])
            law = fit_loss_vs_compute(flops, final[loss_col], n_bootstrap, seed, final["size"])
        else:
            raise AnalysisError(f"step1 = {step1!r}: use {STEP1_ND!r} or {STEP1_COMPUTE!r}")
        sigmoid = fit_sigmoid(
            points[loss_col], points[acc_col], chance, n_bootstrap, seed + 1, ceiling, floor
        )
    except AnalysisError as e:
        raise AnalysisError(f"task {task!r}: {e}" + (f" ({gaps})" if gaps else "")) from e
    flags = [f"MISSING: {gaps}: both steps fitted without those points"] if gaps else []
    min_loss = float(final[loss_col].min())
    flags += [f"step 1 DEGENERATE: {f}" for f in fit_flags(law, min_loss)]
    flags += [f"step 1 UNRESOLVED: {f}" for f in unresolved(law, min_loss)]
    acc = points[acc_col].to_numpy(float)
    examples_col = task + EXAMPLES_SUFFIX
    examples = float(points[examples_col].median()) if examples_col in points else math.nan
    flags += [f"step 2 UNRESOLVED: {f}" for f in sigmoid_flags(sigmoid, acc, examples)]
    return TaskLaw(task, law, sigmoid, flags, accuracy, final_only)


def predict_tasks(
    points: pd.DataFrame,
    chances: dict[str, float],
    N: float,
    D: float,
    at: str = "",
    measured: dict[str, tuple[float, float]] | None = None,
    **fit_kw,
) -> TaskReport:
    """Every task of ``chances`` fitted on ``points`` and predicted at (N, D); ``measured``:
    (task loss, accuracy) by task where known. A task that cannot be fitted is skipped, the
    report saying why (:func:`fit_each_task`)."""
    measured = measured or {}
    laws, skipped = fit_each_task(points, chances, fit_kw)
    preds = [
        law.predict(N, D, at, *measured.get(task, (math.nan, math.nan)))
        for task, law in laws.items()
    ]
    return TaskReport(preds, f"two-step task prediction at N={N:.3g}, D={D:.3g}", laws, skipped)


def fit_each_task(
    points: pd.DataFrame, chances: dict[str, float], fit_kw: dict
) -> tuple[dict[str, TaskLaw], list[str]]:
    """:func:`fit_task` for each task of ``chances``, and for those it cannot fit a line naming
    the task and why: one task the points cannot support costs no other its prediction. None
    fitted is an error that gives every task's reason."""
    laws, skipped = {}, []
    for task, chance in chances.items():
        try:
            laws[task] = fit_task(points, task, chance, **fit_kw)
        except AnalysisError as e:
            skipped.append(str(e))
    if skipped and not laws:
        raise AnalysisError("; ".join(skipped))
    return laws, skipped


def task_holdout_check(points: pd.DataFrame, chances: dict[str, float], **fit_kw) -> TaskReport:
    """The largest size held out: both steps fitted on the smaller sizes, each task predicted at
    every held-out run's final (N, tokens) beside what that run measured."""
    largest = points["N"].max()
    train, held = points[points["N"] < largest], final_points(points[points["N"] == largest])
    if train["N"].nunique() < 3:
        raise AnalysisError(
            f"the held-out check needs >= 3 sizes below the largest, got {train['N'].nunique()}"
        )
    laws, skipped = fit_each_task(train, chances, fit_kw)
    preds = []
    for task, law in laws.items():
        for _, row in held.iterrows():
            measured = (row[task + TASK_LOSS_SUFFIX], row[f"{task}/{law.accuracy}"])
            at = f"{row['tokens']:.3g} tok"
            examples = row.get(task + EXAMPLES_SUFFIX, 0)
            examples = int(examples) if pd.notna(examples) else 0
            preds.append(law.predict(row["N"], row["tokens"], at, *map(float, measured), examples))
    size = held["size"].iloc[0]
    return TaskReport(
        preds, f"held out {size} (N={largest:.3g}): predicted vs measured", laws, skipped
    )
