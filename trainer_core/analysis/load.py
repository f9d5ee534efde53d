"""Reading an experiment dir (see docs/run_layout.md) into tidy pandas DataFrames, no W&B or Ray needed.

Everything analysis fits or plots comes from the files the trainer writes: ``run.json`` for what a
run is, ``metrics.jsonl`` for its curves, ``metrics_step{N}.json`` for the evals at permanent
checkpoints (the points scaling laws are fitted to). Task evals (``task/<name>/<metric>``) come
out as one wide frame with the ladder table's column names (``<name>/bpb``, ``<name>/acc``), so
the two-step task fits read a run here as they read a table of published results.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError
from trainer_core.checkpoint.listing import list_checkpoints
from trainer_core.errors import RunWarning
from trainer_core.io import storage
from trainer_core.io.records import RecordError, read_json_record
from trainer_core.io.run_dir import (
    RUN_FIELDS,
    RUN_JSON,
    RUNS,
    TUNE,
    WIDEN_DIR,
    metric_lines,
    metrics_path,
    metrics_step_files,
    recorded_experiment_kind,
    run_json_path,
)


def analysis_flops(n: float | np.ndarray, tokens: float | np.ndarray) -> float | np.ndarray:
    """The compute every fit, plot and target of the analysis is in: C = 6 N D (N non-embedding
    parameters, D tokens), as in Chinchilla's approach 3 and the target table's C (its price
    counts attention too, as the planner does).

    The planner and MFU count attention's FLOPs too (``flops_per_token``: 27-57% more at the
    demo's sizes, 10-30% at 20M-1B with 2,048-token sequences); fitting the frontier and the
    isoFLOP budgets on that count while approach 2's D_opt = C / 6 N_opt and approach 3's
    optimum take C = 6 N D had each column of the target table answer another budget."""
    return 6.0 * n * tokens


METRIC_COLUMNS = [
    "size",
    "name",
    "N",
    "peak_lr",
    "step",
    "tokens",
    "flops",
    "train_loss",
    "eval_loss",
]
POINT_COLUMNS = [*METRIC_COLUMNS, "lr_at_step", "annealed"]
TASK_PREFIX = "task/"
TASK_COLUMNS = [*METRIC_COLUMNS, "annealed"]
"""The task frame's leading columns; then ``<task>/<metric>`` for each task metric logged."""
CHANCE_SUFFIX = "/chance"
UNKNOWN_STATUS = "unknown"
"""A run whose run.json records no status (an old record): it may still write more."""
CHECKPOINT_COLUMNS = [
    "name",
    "size",
    "step",
    "tokens",
    "path",
    "complete",
    "permanent",
    "metrics_path",
]
ANNEALED_LR_FRACTION = 0.5
"""For records without the trainer's ``annealed`` flag (written before it logged one, or by
another trainer): an eval counts as annealed when the LR logged with it is at most this fraction
of the peak. It tells WSD-S's pre-decay saves (at peak LR) from its decay ends, but would also
admit a cosine run's checkpoints past mid-decay, which the flag does not."""


@dataclass
class ExperimentResults(ShownAsText):
    """An experiment (or a single run) as DataFrames; see :func:`load`."""

    path: Path | str
    """The experiment dir, or its URL (``s3://...``)."""
    runs: pd.DataFrame
    metrics: pd.DataFrame
    points: pd.DataFrame
    checkpoints: pd.DataFrame
    tasks: pd.DataFrame
    """Every eval with task metrics, one row per (run, step): checkpoint evals and those of
    ``metrics.jsonl`` (``annealed`` from the LR logged with them; unknown counts as not)."""

    def __str__(self) -> str:
        """What was read, in three lines: the runs by status and size, the evals, and where to
        look next (the notebook display of a result)."""
        runs = self.runs.sort_values("num_params") if len(self.runs) else self.runs
        statuses = ", ".join(f"{n} {s}" for s, n in runs["status"].value_counts().items())
        sizes = ", ".join(dict.fromkeys(str(s) for s in runs["size"]))
        annealed = int(self.points["annealed"].astype(bool).sum()) if len(self.points) else 0
        return "\n".join(
            [
                f"{self.kind} {self.path}: {len(runs)} runs ({statuses or 'none'}); "
                f"sizes {sizes or '-'}",
                f"{len(self.metrics)} metrics lines, {len(self.points)} checkpoint evals "
                f"({annealed} annealed), {len(self.tasks)} task evals of "
                f"{', '.join(self.task_names) or 'no task'}",
                "frames: .runs .metrics .points .checkpoints .tasks; "
                ".final() .fit_points() .task_points() .result_grid()",
            ]
        )

    @property
    def kind(self) -> str:
        """ "ladder" or "LR sweep", as the experiment's record says
        (:func:`trainer_core.io.run_dir.experiment_kind`); a dir without one reads as a ladder."""
        return recorded_experiment_kind(self.path) or "ladder"

    @property
    def is_lr_sweep(self) -> bool:
        return self.kind == "LR sweep"

    def final(self) -> pd.DataFrame:
        """One row per run: its last logged step and its final / best eval and train loss."""
        rows = []
        for run in self.runs.itertuples(index=False):
            m = self.metrics[self.metrics["name"] == run.name].sort_values("step")
            p = self.points[self.points["name"] == run.name].sort_values("step")
            evals = pd.concat([m[["step", "eval_loss"]], p[["step", "eval_loss"]]]).dropna()
            evals = evals.sort_values("step", kind="stable")
            train = m["train_loss"].dropna()
            step = int(max(m["step"].max() if len(m) else 0, run.last_step or 0))
            rows.append(
                {
                    "size": run.size,
                    "name": run.name,
                    "N": run.num_params,
                    "peak_lr": run.peak_lr,
                    "status": run.status,
                    "step": step,
                    "tokens": step * run.global_batch_tokens,
                    "flops": analysis_flops(
                        float(run.num_params), float(step * run.global_batch_tokens)
                    ),
                    "final_eval_loss": evals["eval_loss"].iloc[-1] if len(evals) else math.nan,
                    "best_eval_loss": evals["eval_loss"].min() if len(evals) else math.nan,
                    "final_train_loss": train.iloc[-1] if len(train) else math.nan,
                }
            )
        return pd.DataFrame(rows)

    def fit_points(self, annealed_only: bool = True) -> pd.DataFrame:
        """(N, tokens, flops, eval_loss) points for scaling fits, diverged runs left out.

        The permanent-checkpoint evals when there are any, else the evals of ``metrics.jsonl``
        (runs without permanent checkpoints); only annealed ones by default, so a ladder read
        before any decay has ended gives no points rather than stable-phase losses.
        """
        ok = set(self.runs.loc[self.runs["status"] != "diverged", "name"])
        pts = self.points[self.points["name"].isin(ok)]
        if pts.empty:
            pts = self.metrics[self.metrics["name"].isin(ok)].dropna(subset=["eval_loss"])
        if annealed_only:
            pts = pts[pts["annealed"].astype(bool)]
        cols = ["size", "name", "N", "peak_lr", "step", "tokens", "flops", "eval_loss"]
        # A boolean mask on no rows too: .map(math.isfinite) gave a float Series there, which
        # pandas took as column labels (a frame without columns: each fit's KeyError).
        finite = np.isfinite(pts["eval_loss"].to_numpy(dtype=float))
        return pts.loc[finite, cols].reset_index(drop=True)

    @property
    def task_names(self) -> list[str]:
        """Tasks with a task loss and an accuracy, in the order the runs logged them."""
        from trainer_core.analysis.ladder_table import task_names  # it imports this module

        return task_names(self.tasks)

    def task_chances(self) -> dict[str, float]:
        """Each task's chance accuracy (a random guess), as its evals recorded it."""
        return {t: float(self.tasks[t + CHANCE_SUFFIX].dropna().mean()) for t in self.task_names}

    def task_points(self, annealed_only: bool = True) -> pd.DataFrame:
        """The task frame for the two-step fits, diverged runs left out: the evals of the
        annealed checkpoints :meth:`fit_points` fits when there are any (else every eval). An
        eval of ``metrics.jsonl`` whose LR happens to be low (a cosine run's second half) is a
        run cut mid-decay, not a finished one."""
        ok = set(self.runs.loc[self.runs["status"] != "diverged", "name"])
        pts = self.tasks[self.tasks["name"].isin(ok)]
        if annealed_only:
            kept = self.points[self.points["annealed"]]
            finished = set(zip(kept["name"], kept["step"], strict=True))
            at = pts[[key in finished for key in zip(pts["name"], pts["step"], strict=True)]]
            if not at.empty:
                pts = at
        return pts.reset_index(drop=True)

    def result_grid(self, tune_name: str = TUNE):
        """The Ray Tune ResultGrid of one Tune experiment (optional: needs Ray installed):
        ``<exp_dir>/tune``, the ladder's or a sweep's first round (its widening rounds are
        ``tune-widen<k>``: :meth:`result_grids` has them all).

        Read-only: built from Tune's saved experiment state, so no trainable or Ray cluster is
        needed; best result = lowest ``eval/loss``. A trial's name (``config/trial/name``) is
        its run's ``trial`` in :attr:`runs`; its checkpoints are the run's own (``checkpoints``
        here), not Tune's, so ``Result.checkpoint`` is None. A trial's ``metrics_dataframe``
        starts at the trial's last start (after a ``--resume``, that session's reports only):
        :attr:`metrics` is the complete record. Its last row is the run's summary, reported
        once training ended (``finished`` = 1, with ``train/loss_last`` and ``diverged``): its
        step repeats the last eval's.
        """
        tune_dir = storage.join(self.path, tune_name)
        names = storage.entries(tune_dir)  # one listing on the way to the grid
        if not names and not storage.is_dir(tune_dir):
            where = (
                "this is a run dir: the Tune state is in its experiment's dir, two levels up"
                if storage.is_file(run_json_path(self.path))
                else "only Tune-run experiments have one"
            )
            raise AnalysisError(f"{tune_dir}: no Tune experiment here ({where})")
        try:
            from ray import tune
        except ImportError:
            raise AnalysisError("result_grid() needs Ray: pip install 'ray[tune]'") from None
        if not any(n.startswith("experiment_state") for n in names):
            raise AnalysisError(
                f"{tune_dir}: no experiment_state file (a launch stopped before Tune saved its "
                "state); the runs' own records are in runs/"
            )
        analysis = tune.ExperimentAnalysis(
            str(tune_dir), default_metric="eval/loss", default_mode="min"
        )
        return tune.ResultGrid(analysis)

    def result_grids(self) -> dict:
        """Every Tune experiment of the dir by name, in order: ``tune``, then an LR sweep's
        widening rounds ``tune-widen1``, ``tune-widen2``, ... A round a launch left without
        saved state is skipped with a warning: the others stay readable."""
        dirs = [n for n, size in storage.entries(self.path).items() if size is None]
        rounds = sorted((int(m[1]), n) for n in dirs if (m := WIDEN_DIR.match(n)))
        grids = {TUNE: self.result_grid()}  # the first round, or the error that says why not
        for _, name in rounds:
            try:
                grids[name] = self.result_grid(name)
            except AnalysisError as e:
                warnings.warn(f"skipped {e}", RunWarning, stacklevel=2)
        return grids


def load(exp_dir: str | Path) -> ExperimentResults:
    """Load ``<exp_dir>/runs/*`` (or ``exp_dir`` itself when it is one run dir).

    ``exp_dir`` may be a URL (``s3://bucket/prefix``): its records are staged to a temporary dir
    (checkpoint tensors left out, see :func:`storage.stage_records`) and read by the same code,
    with the URL in place of the staged path in the result, in any error and in any warning.
    ``results.path`` is ``exp_dir`` made canonical (absolute, ``~`` expanded), the one spelling
    the analysis uses.
    """
    exp_dir = storage.canonical(exp_dir)
    if not storage.is_url(exp_dir):
        return _load_local(Path(exp_dir))
    url = exp_dir
    with tempfile.TemporaryDirectory(prefix="rayladder-analysis-") as tmp:
        if not storage.is_dir(url):
            raise AnalysisError(f"{url}: no such directory; pass an experiment dir or a run dir")
        staged = storage.stage_records(url, Path(tmp))
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                results = _load_local(staged)
        except AnalysisError as e:
            raise AnalysisError(str(e).replace(tmp, url)) from None
        finally:  # outside the catching block, so the filters the caller set apply
            for w in caught:
                warnings.warn(str(w.message).replace(tmp, url), w.category, stacklevel=2)

    def relocate(value: Any) -> Any:
        return str(value).replace(tmp, url) if isinstance(value, str | Path) else value

    results.path = url
    results.runs["dir"] = results.runs["dir"].map(relocate)
    for column in ("path", "metrics_path"):
        results.checkpoints[column] = results.checkpoints[column].map(relocate)
    return results


def _load_local(root: Path) -> ExperimentResults:
    run_dirs = find_run_dirs(root)
    runs, metrics, points, checkpoints, tasks = [], [], [], [], []
    for run_dir in run_dirs:
        run = read_run_json(run_dir)
        runs.append(run)
        run_metrics, run_points = read_metrics(run_dir, run), read_points(run_dir, run)
        metrics.extend(run_metrics)
        points.extend(run_points)
        tasks.extend(_task_rows(run_metrics, run_points))
        for c in list_checkpoints(run_dir):
            # info.json holds the tokens; a dir too broken to have one still gets its estimate.
            tokens = c.tokens or c.step * int(run["global_batch_tokens"])
            checkpoints.append(
                {"name": run["name"], "size": run["size"], **c.__dict__, "tokens": tokens}
            )
    runs_df = pd.DataFrame(runs)
    runs_df = runs_df.sort_values(["num_params", "peak_lr", "name"], kind="stable").reset_index(
        drop=True
    )
    return ExperimentResults(
        path=root,
        runs=runs_df,
        metrics=_frame(metrics, [*METRIC_COLUMNS, "annealed"], ["N", "peak_lr", "name", "step"]),
        points=_frame(points, POINT_COLUMNS, ["N", "peak_lr", "name", "step"]),
        checkpoints=_frame(checkpoints, CHECKPOINT_COLUMNS, ["name", "step"]),
        tasks=_frame(tasks, _task_frame_columns(tasks), ["N", "peak_lr", "name", "step"]),
    )


def find_run_dirs(root: Path) -> list[Path]:
    """``root`` when it is a run dir, else its runs with a ``run.json``. A run dir without one is
    left out with a warning: a live experiment's starting run has its dir 10-30 s before its
    record (or a launch stopped before the run started); refused only when no run has one."""
    if not root.is_dir():
        raise AnalysisError(f"{root}: no such directory; pass an experiment dir or a run dir")
    if run_json_path(root).is_file():
        return [root]
    runs = root / RUNS
    dirs = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    if not dirs:
        raise AnalysisError(
            f"{root}: no run dirs (expected {runs}/<run>/{RUN_JSON}, or {RUN_JSON} in the dir "
            "itself); has the experiment started?"
        )
    started = [d for d in dirs if run_json_path(d).is_file()]
    if not started:
        raise AnalysisError(
            f"{runs}: no run has a {RUN_JSON} yet ({', '.join(d.name for d in dirs)}: starting, "
            "or never started); load again once one has started, or, if the experiment is not "
            "running, rerun it with --resume"
        )
    for run_dir in dirs:
        if run_dir not in started:
            warnings.warn(
                f"{run_dir}: no {RUN_JSON} yet: starting, or never started; left out of the "
                "analysis",
                RunWarning,
                stacklevel=4,
            )
    return started


def read_run_json(run_dir: Path) -> dict[str, Any]:
    path = run_json_path(run_dir)
    record = _read_json(path)
    if "peak_lr" not in record and "lr" in record:  # run.json before the field was renamed
        record["peak_lr"] = record.pop("lr")
    missing = [
        k
        for k in ("num_params", "peak_lr", "global_batch_tokens", "flops_per_token")
        if k not in record
    ]
    if missing:
        raise AnalysisError(f"{path}: missing {', '.join(missing)}; not a rayladder run.json")
    run = {k: record.get(k) for k in RUN_FIELDS if k != "tags"}
    run["name"] = run["name"] or run_dir.name
    run["size"] = run["size"] or run["name"]
    run["last_step"] = int(run["last_step"] or 0)
    run["status"] = run["status"] or UNKNOWN_STATUS
    for key, value in (record.get("tags") or {}).items():
        run[f"tag_{key}"] = value
    run["dir"] = str(run_dir)
    run["trial"] = run_dir.name  # the Tune trial's name (config/trial/name): the join key
    return run


def read_metrics(run_dir: Path, run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per logged step: train and eval lines of the same step are merged. Rows carry
    their task metrics as ``<task>/<metric>`` beyond :data:`METRIC_COLUMNS`."""
    path = metrics_path(run_dir)
    if not path.is_file():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for i, record in _metric_lines(path):
        if "step" not in record:
            raise AnalysisError(f"{path}:{i}: expected a JSON object with a 'step' key")
        row = by_step.setdefault(int(record["step"]), {})
        row.update({k: v for k, v in record.items() if v is not None})
    rows = []
    for step, record in sorted(by_step.items()):
        row = _metric_row(run, step, record)
        row["annealed"] = _annealed(record, run, unknown=False)
        rows.append(row)
    return rows


def _metric_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each readable line of ``metrics.jsonl`` with its number. Damage (a last line cut
    mid-write, a byte that is not UTF-8) is skipped with a warning, so the rest of a run stays
    readable; a line that is text but not a JSON object is an error naming it: a fit must not
    silently miss a point someone's edit broke."""
    for line in metric_lines(path):
        if line.record is not None:
            yield line.number, line.record
        elif line.damaged:
            line.warn(path)
        else:
            raise AnalysisError(f"{path}:{line.number}: {line.problem}; fix or delete that line")


def read_points(run_dir: Path, run: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for named_step, path in metrics_step_files(run_dir):
        record = _read_json(path)
        step = int(record.get("step", named_step))
        row = _metric_row(run, step, record)
        lr = record.get("lr")
        row["lr_at_step"] = math.nan if lr is None else float(lr)
        row["annealed"] = _annealed(record, run, unknown=True)
        rows.append(row)
    return rows


def _annealed(record: dict[str, Any], run: dict[str, Any], unknown: bool) -> bool:
    """Whether an eval is a finished-schedule point: the trainer's flag (the step ends a decay),
    else the LR rule (:data:`ANNEALED_LR_FRACTION`), else ``unknown``."""
    if "annealed" in record:
        return bool(record["annealed"])
    lr = record.get("lr")
    if lr is None:
        return unknown
    return float(lr) <= ANNEALED_LR_FRACTION * float(run["peak_lr"])


def _task_rows(metrics: list[dict[str, Any]], points: list[dict[str, Any]]) -> list[dict]:
    """The rows with task metrics, a checkpoint's over the ``metrics.jsonl`` line of its step."""
    by_step = {row["step"]: row for row in [*metrics, *points] if _has_tasks(row)}
    return [by_step[step] for step in sorted(by_step)]


def _has_tasks(row: dict[str, Any]) -> bool:
    return any(k not in POINT_COLUMNS for k in row)


def _task_frame_columns(rows: list[dict[str, Any]]) -> list[str]:
    extra = {k: None for row in rows for k in row if k not in POINT_COLUMNS}
    return [*TASK_COLUMNS, *extra]


def _metric_row(run: dict[str, Any], step: int, record: dict[str, Any]) -> dict[str, Any]:
    tokens = record.get("tokens")
    tokens = int(tokens) if tokens is not None else step * int(run["global_batch_tokens"])
    return {
        "size": run["size"],
        "name": run["name"],
        "N": run["num_params"],
        "peak_lr": run["peak_lr"],
        "step": step,
        "tokens": tokens,
        "flops": analysis_flops(float(run["num_params"]), float(tokens)),
        "train_loss": _float(record.get("train/loss")),
        "eval_loss": _float(record.get("eval/loss")),
        **{
            k[len(TASK_PREFIX) :]: _float(v) for k, v in record.items() if k.startswith(TASK_PREFIX)
        },
    }


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _read_json(path: Path) -> dict[str, Any]:
    """A ``run.json`` or ``metrics_step{N}.json``; a damaged one is refused in the words every
    command uses (:func:`read_json_record`), as an :class:`AnalysisError` like any other file
    the analysis can't use (callers turn those into their own messages)."""
    try:
        return read_json_record(path)
    except RecordError as e:
        raise AnalysisError(str(e)) from None
    except OSError as e:
        raise AnalysisError(f"{path}: can't read ({e.strerror})") from None


def _frame(rows: list[dict[str, Any]], columns: list[str], order: list[str]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=columns)
    return df.sort_values(order, kind="stable").reset_index(drop=True) if len(df) else df
