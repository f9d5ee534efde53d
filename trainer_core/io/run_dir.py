"""The on-disk layout of runs and experiments: every file name, the ``run.json`` record, atomic writes.

The trainer, the checkpointer, the Ray layer and the analysis all name files through this module,
so the layout described in docs/run_layout.md has one owner. It imports neither torch nor Ray:
reading a run dir must not need them.

A run dir::

    config.yaml                      the resolved config
    run.json                         RunInfo + status, diverged_step, last_step, workers (+ error)
    metrics.jsonl                    one line per log interval or eval
    metrics_step{N}.json             the metrics saved with the permanent checkpoint of step N
    checkpoints/step-{N:08d}/        a checkpoint (what it holds: trainer_core.checkpoint)
    checkpoints/step-{N:08d}.tmp-*   scratch of a save in flight (.old-*: of a re-save)
    checkpoints/step-{N:08d}.corrupt-*  a checkpoint moved aside after failing its checksums

An experiment dir (ladder or LR sweep): ``experiment.yaml``, ``plan.json``, ``runs/<name>/`` (a
run dir per trial) and Tune's state in ``tune/``.

``config.yaml``, ``run.json`` and ``metrics_step{N}.json`` are replaced whole
(:func:`write_atomic`): a reader, or a crash, sees the old content or the new, never a mix.
``metrics.jsonl`` is appended to (and rewritten whole when a resume drops replayed steps).

The library reads ``metrics.jsonl`` only through :func:`metric_lines`, so a damaged line has one
rule: a line that is not a JSON object (a last line cut mid-write by a kill, a byte that is not
UTF-8 in a damaged copy, a line someone edited) is skipped with a :class:`RunWarning` naming
``file:line``, never a crash; the analysis alone refuses an edited line (not damage), so no fit
silently misses a point. A rewrite keeps every line it can't read: only a line it reads as past
the resumed step goes, and a cut last line (:func:`resumed_metric_lines` says why).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from trainer_core.errors import RunWarning
from trainer_core.io import storage
from trainer_core.io.records import read_json_record, read_yaml_record
from trainer_core.io.storage import Location, write_atomic

CONFIG = "config.yaml"
RUN_JSON = "run.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
WANDB = "wandb"
"""W&B's own dir (``wandb.init(dir=<run dir>)`` writes into ``<run dir>/wandb``)."""
LOGGED_STEP = "rayladder-logged-step"
"""In ``wandb/``: "<W&B run id> <step>", the last step that run logged, over all its starts."""

EXPERIMENT = "experiment.yaml"
PLAN = "plan.json"
RUNS = "runs"
TUNE = "tune"
WIDEN = "tune-widen"
"""An LR sweep's k-th widening round keeps its Tune state in ``tune-widen<k>``."""
WIDEN_DIR = re.compile(rf"^{WIDEN}(\d+)$")
"""A widening round's dir name; group 1 is k."""
LR_SCHEDULE = "lr_schedule.png"
ANALYSIS = "analysis"
"""``workflows/analyze.py``'s default output: ``REPORT_TEXT`` and the PNG plots."""
REPORT_TEXT = "report.txt"

METRICS_STEP = re.compile(r"^metrics_step(\d+)\.json$")
"""A ``metrics_step{N}.json`` file name; group 1 is N."""
STEP_DIR = re.compile(r"^step-(\d{8,})$")
"""A committed checkpoint dir's name; group 1 is the step."""
SCRATCH_DIR = re.compile(r"^step-(\d{8,})\.(tmp|old)-\w+$")
"""A save's scratch dir (``tmp``: being written; ``old``: the one a re-save replaces)."""

FINAL_STATUSES = ("finished", "diverged")
"""A run in one of these is done: running it again returns its record at once."""
OPEN_STATUSES = ("running", "interrupted")
"""A run in one of these may still write more: it is live, or resumes where it stopped."""


@dataclass
class RunInfo:
    """What a run is: the part of ``run.json`` fixed at its start."""

    name: str
    num_params: int
    flops_per_token: int
    peak_lr: float
    """The schedule's peak; the LR of each step is ``lr`` in the metrics."""
    global_batch_tokens: int
    seq_len: int
    total_steps: int
    size: str = ""
    tags: dict[str, Any] = field(default_factory=dict)
    data_id: str = ""
    """The training data's content (``TokenData.content_id``): a relaunch on other data is
    refused, as one with other settings is."""


@dataclass
class WorkerGroup:
    """One start or restart of a run's ranks: a restart onto other nodes shows as a new group."""

    start_step: int
    time: float
    """When the group began training (Unix seconds, after loading its checkpoint)."""
    ranks: list[dict[str, str]]
    """Per rank, where it ran: ``host``, plus what the launcher adds (``node_id`` on Ray)."""


RUN_FIELDS = (
    *(f.name for f in fields(RunInfo)),
    "status",
    "diverged_step",
    "last_step",
    "workers",
)
"""Every key of ``run.json`` in the order it is written. ``status``: running, finished, diverged
(``diverged_step`` says when), stopped (by Tune's early stopping), interrupted (Ctrl+C or SIGTERM on
a run, or on a ladder or sweep that cut it off: re-running, with ``--resume`` for those,
resumes it) or failed (with an ``error`` key);
``workers``: a :class:`WorkerGroup` per (re)start, oldest first."""


def config_path(run_dir: Location) -> Location:
    return storage.join(run_dir, CONFIG)


def run_json_path(run_dir: Location) -> Location:
    return storage.join(run_dir, RUN_JSON)


def metrics_path(run_dir: Location) -> Location:
    return storage.join(run_dir, METRICS)


def metrics_step_path(run_dir: Location, step: int) -> Location:
    return storage.join(run_dir, f"metrics_step{step}.json")


def metrics_step_files(run_dir: Location) -> list[tuple[int, Location]]:
    """Every ``metrics_step{N}.json`` of a run as (N, path), sorted by file name."""
    found = sorted(n for n, size in storage.entries(run_dir).items() if size is not None)
    return [
        (int(m.group(1)), storage.join(run_dir, n)) for n in found if (m := METRICS_STEP.match(n))
    ]


def checkpoints_dir(run_dir: Location) -> Location:
    return storage.join(run_dir, CHECKPOINTS)


def step_dir(run_dir: Location, step: int) -> Location:
    return storage.join(checkpoints_dir(run_dir), f"step-{step:08d}")


def beside(path: Location, kind: str, token: str) -> Location:
    """``step-N.<kind>-<token>`` next to the checkpoint dir ``step-N`` (kind: tmp, old, corrupt)."""
    return storage.sibling(path, f"{storage.name(path)}.{kind}-{token}")


def scratch_dirs(run_dir: Location, kind: str = "*") -> list[Location]:
    """The scratch dirs of a run's saves (``kind``: tmp, old or both), sorted by name."""
    root = checkpoints_dir(run_dir)
    return [
        storage.join(root, n)
        for n, size in sorted(storage.entries(root).items())
        if size is None and (m := SCRATCH_DIR.match(n)) and kind in ("*", m.group(2))
    ]


def write_run_json(
    run_dir: Location,
    info: RunInfo,
    status: str,
    *,
    last_step: int,
    diverged_step: int | None = None,
    workers: list[WorkerGroup] | None = None,
    error: str | None = None,
) -> None:
    record = {
        **asdict(info),
        "status": status,
        "diverged_step": diverged_step,
        "last_step": last_step,
        "workers": [asdict(g) for g in workers or []],
        **({"error": error} if error else {}),
    }
    write_atomic(run_json_path(run_dir), json.dumps(record, indent=2))


def read_run_json(run_dir: Location) -> dict[str, Any] | None:
    """The run's record as written (None: the run has not started); a damaged one is a
    :class:`~trainer_core.io.records.RecordError`."""
    path = run_json_path(run_dir)
    return read_json_record(path) if storage.is_file(path) else None


def worker_groups(run_dir: Location) -> list[WorkerGroup]:
    """The worker groups run.json records so far ([] before the first start)."""
    return [WorkerGroup(**g) for g in (read_run_json(run_dir) or {}).get("workers", [])]


@dataclass(frozen=True)
class MetricLine:
    """One non-blank line of ``metrics.jsonl``: its bytes as stored and its record, if any."""

    number: int
    raw: bytes
    """Without its newline: what a rewrite writes back, byte for byte."""
    record: dict[str, Any] | None
    problem: str = ""
    """Why ``record`` is None: "not UTF-8 text", "not valid JSON (<why>)", "not a JSON object"."""
    cut: bool = False
    """The last line, unreadable and with no newline: a write cut short by a kill."""

    @property
    def damaged(self) -> bool:
        """Cut, or not text: damage, not an edit someone can fix in place."""
        return self.cut or self.problem == "not UTF-8 text"

    def warn(self, path: Location) -> None:
        """The one warning for a line a reader skips."""
        why = "cut mid-write" if self.cut else f"that is {self.problem}"
        warnings.warn(f"{path}:{self.number}: ignoring a line {why}", RunWarning, stacklevel=3)


def metric_lines(path: Location) -> list[MetricLine]:
    """Every non-blank line of ``metrics.jsonl`` (none without the file), numbered as an editor
    numbers them, parsed; the caller decides what an unreadable one means (the module's rule)."""
    data = storage.read_bytes(path) if storage.is_file(path) else b""
    raws = data.split(b"\n")
    return [
        _parse_metric_line(number, raw, cut=number == len(raws))
        for number, raw in enumerate(raws, start=1)
        if raw.strip()
    ]


def _parse_metric_line(number: int, raw: bytes, cut: bool) -> MetricLine:
    try:
        record = json.loads(raw.decode())
    except UnicodeDecodeError:
        return MetricLine(number, raw, None, "not UTF-8 text", cut)
    except json.JSONDecodeError as e:
        return MetricLine(number, raw, None, f"not valid JSON ({e.msg})", cut)
    if not isinstance(record, dict):
        return MetricLine(number, raw, None, "not a JSON object", cut)
    return MetricLine(number, raw, record)


def metric_records(path: Location) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of each readable line of ``metrics.jsonl``; any other line is
    skipped with a warning: a run's own readers must go on over a line they can't use."""
    for line in metric_lines(path):
        if line.record is None:
            line.warn(path)
            continue
        yield line.number, line.record


def resumed_metric_lines(path: Location, step: int) -> list[bytes]:
    """The lines of ``metrics.jsonl`` a run resumed at ``step`` keeps, each with its newline:
    all but those it reads as past ``step`` (the replay logs them again) and a cut last line.
    That one is past ``step`` too: a line is flushed before the checkpoint that follows it, so
    only a line after the last checkpoint can be cut; kept, it would stop being the last."""
    kept = []
    for line in metric_lines(path):
        if line.record is None and not line.cut:  # a cut line is a kill's, dropped unsaid
            line.warn(path)
        past = line.cut or (line.record is not None and (_step(line.record) or 0) > step)
        if not past:
            kept.append(line.raw + b"\n")
    return kept


def write_metrics(path: Location, lines: list[bytes]) -> None:
    """Replace ``metrics.jsonl`` whole with ``lines`` as bytes: a kept line may not be UTF-8."""
    storage.write_atomic(path, b"".join(lines))


def _step(record: dict[str, Any]) -> int | None:
    """A record's step; None when it has no whole number there (a line someone edited)."""
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def last_logged_step(run_dir: Location) -> int:
    """The step of the last readable line of ``metrics.jsonl`` with one (0: none)."""
    last = 0
    for _, record in metric_records(metrics_path(run_dir)):
        last = _step(record) or last
    return last


def mark_stopped(run_dir: Location) -> None:
    """Record a run still ``running`` after its trial ended (Tune's early stopping ended it) as
    ``stopped``, or as ``finished`` when its last step was logged: ASHA stops every trial that
    reaches ``max_t``, at its last report, which can land before the run writes "finished"."""
    _end_running(
        run_dir,
        lambda r: {"status": "finished" if r["last_step"] >= r["total_steps"] else "stopped"},
    )


def mark_failed(run_dir: Location, error: str) -> None:
    """Record a run still ``running`` after its trial errored as ``failed``, with ``error``. Only
    rank 0 writes ``run.json``: a bad shard met by another rank, a worker group killed, or
    restarts run out end the run without it saying so."""
    _end_running(run_dir, lambda record: {"status": "failed", "error": error})


def mark_interrupted(run_dir: Location) -> int:
    """Record a run still ``running`` as ``interrupted`` at its last logged step: resumable, as
    a Ctrl+C'd run without Ray records itself (a Ray Train run's ranks are killed first). The
    step run.json records."""
    return _end_running(run_dir, lambda record: {"status": "interrupted"}).get("last_step", 0)


def _end_running(
    run_dir: Location, changes: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """Rewrite a ``running`` record with its last logged step and ``changes(record)``; any other
    record is left as it is. The record as it now stands ({} for none)."""
    record = read_run_json(run_dir)
    if record is None or record.get("status") != "running":
        return record or {}
    record["last_step"] = max(record.get("last_step", 0), last_logged_step(run_dir))
    record.update(changes(record))
    write_atomic(run_json_path(run_dir), json.dumps(record, indent=2))
    return record


def write_metrics_step(run_dir: Location, step: int, record: dict[str, Any]) -> None:
    """The metrics kept beside the permanent checkpoint of ``step``."""
    write_atomic(metrics_step_path(run_dir, step), json.dumps(record, indent=2, default=float))


def experiment_kind(record: Mapping) -> str:
    """The one rule for "ladder" vs "LR sweep", on an experiment's top-level config keys (a
    job's fields, or its ``experiment.yaml``): an LR sweep's config has a ``sweep`` section."""
    return "LR sweep" if "sweep" in record else "ladder"


def recorded_experiment_kind(exp_dir: Location) -> str | None:
    """:func:`experiment_kind` of the experiment recorded in ``exp_dir``; None without a record
    (a new dir, a single run's dir); a damaged record is a
    :class:`~trainer_core.io.records.RecordError`."""
    path = storage.join(exp_dir, EXPERIMENT)
    if not storage.is_file(path):
        return None
    return experiment_kind(read_yaml_record(path))
