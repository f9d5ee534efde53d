"""The on-disk layout of runs and experiments: every file name, the ``run.json`` record, atomic writes.

The trainer, the checkpointer, the Ray layer and the analysis all name files through this module,
so the layout described in docs/run_layout.md has one owner. It imports neither torch nor Ray:
reading a run dir must not need them.

A run dir::

    config.yaml                      the resolved config
    run.json                         RunInfo + status, diverged_step, last_step (+ error)
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
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

CONFIG = "config.yaml"
RUN_JSON = "run.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"

EXPERIMENT = "experiment.yaml"
PLAN = "plan.json"
RUNS = "runs"
TUNE = "tune"

METRICS_STEP = re.compile(r"^metrics_step(\d+)\.json$")
"""A ``metrics_step{N}.json`` file name; group 1 is N."""
STEP_DIR = re.compile(r"^step-(\d{8,})$")
"""A committed checkpoint dir's name; group 1 is the step."""
SCRATCH_DIR = re.compile(r"^step-(\d{8,})\.(tmp|old)-\w+$")
"""A save's scratch dir (``tmp``: being written; ``old``: the one a re-save replaces)."""

FINAL_STATUSES = ("finished", "diverged")
"""A run in one of these is done: running it again returns its record at once."""


@dataclass
class RunInfo:
    """What a run is: the part of ``run.json`` fixed at its start."""

    name: str
    num_params: int
    flops_per_token: int
    lr: float
    global_batch_tokens: int
    seq_len: int
    total_steps: int
    size: str = ""
    tags: dict[str, Any] = field(default_factory=dict)


RUN_FIELDS = (*(f.name for f in fields(RunInfo)), "status", "diverged_step", "last_step")
"""Every key of ``run.json`` in the order it is written. ``status``: running, finished, diverged
(``diverged_step`` says when), stopped (by Tune's early stopping) or failed (with an ``error`` key)."""


def config_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONFIG


def run_json_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / RUN_JSON


def metrics_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / METRICS


def metrics_step_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / f"metrics_step{step}.json"


def metrics_step_files(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Every ``metrics_step{N}.json`` of a run as (N, path), sorted by file name."""
    found = sorted(Path(run_dir).glob("metrics_step*.json"))
    return [(int(m.group(1)), p) for p in found if (m := METRICS_STEP.match(p.name))]


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def step_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"step-{step:08d}"


def beside(path: Path, kind: str, token: str) -> Path:
    """``step-N.<kind>-<token>`` next to the checkpoint dir ``step-N`` (kind: tmp, old, corrupt)."""
    return path.with_name(f"{path.name}.{kind}-{token}")


def scratch_dirs(run_dir: str | Path, kind: str = "*") -> list[Path]:
    """The scratch dirs of a run's saves (``kind``: tmp, old or both), sorted by name."""
    root = checkpoints_dir(run_dir)
    found = sorted(root.glob(f"step-*.{kind}-*")) if root.is_dir() else []
    return [p for p in found if SCRATCH_DIR.match(p.name)]


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` whole, through ``<name>.tmp`` and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_run_json(
    run_dir: str | Path,
    info: RunInfo,
    status: str,
    *,
    last_step: int,
    diverged_step: int | None = None,
    error: str | None = None,
) -> None:
    record = {
        **asdict(info),
        "status": status,
        "diverged_step": diverged_step,
        "last_step": last_step,
        **({"error": error} if error else {}),
    }
    write_atomic(run_json_path(run_dir), json.dumps(record, indent=2))


def read_run_json(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's record as written (None: the run has not started)."""
    path = run_json_path(run_dir)
    return json.loads(path.read_text()) if path.exists() else None


def last_logged_step(run_dir: str | Path) -> int:
    """The step of the last whole line of ``metrics.jsonl`` (0: none)."""
    path = metrics_path(run_dir)
    last = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            last = int(json.loads(line).get("step", last))
        except (ValueError, AttributeError):
            continue  # a line cut by a kill mid-write
    return last


def mark_stopped(run_dir: str | Path) -> None:
    """Record a run still ``running`` after its trial ended (Tune's early stopping ended it) as
    ``stopped``, or as ``finished`` when its last step was logged: ASHA stops every trial that
    reaches ``max_t``, at its last report, which can land before the run writes "finished"."""
    record = read_run_json(run_dir)
    if record is None or record.get("status") != "running":
        return
    record["last_step"] = max(record.get("last_step", 0), last_logged_step(run_dir))
    done = record["last_step"] >= record["total_steps"]
    record["status"] = "finished" if done else "stopped"
    write_atomic(run_json_path(run_dir), json.dumps(record, indent=2))


def write_metrics_step(run_dir: str | Path, step: int, record: dict[str, Any]) -> None:
    """The metrics kept beside the permanent checkpoint of ``step``."""
    write_atomic(metrics_step_path(run_dir, step), json.dumps(record, indent=2, default=float))
