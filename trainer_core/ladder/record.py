"""An experiment's record on disk (``experiment.yaml``, ``plan.json``) and the checks before a
launch (preflight)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from trainer_core.config.diff import changed_keys
from trainer_core.config.loader import ConfigError, to_dict, to_yaml
from trainer_core.config.sections import DataConfig, TrainConfig
from trainer_core.data.tasks import TaskFormatError, check_task_files
from trainer_core.data.token_data import TokenData, open_token_data
from trainer_core.errors import UserError
from trainer_core.io import storage
from trainer_core.io.output_dir import canonical_output, check_output_dir
from trainer_core.io.records import read_json_record, read_yaml_record
from trainer_core.io.run_dir import (
    EXPERIMENT,
    LR_SCHEDULE,
    PLAN,
    experiment_kind,
    recorded_experiment_kind,
)
from trainer_core.io.storage import Location, write_atomic
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.plan import SizePlan
from trainer_core.train.schedule import plot_schedule

T = TypeVar("T")
J = TypeVar("J", bound=LadderConfig)


def preflight(
    job: LadderConfig, dry_run: bool = False, dir_key: str = "dir"
) -> tuple[list[str], TokenData | None]:
    """Fail before any trial starts: unreadable data / tokenizer mismatch, a missing or bad task
    file (``evals.tasks``, else found by every run once Ray has launched them all), unwritable
    output dir, or a dir that already holds the other kind of experiment, whose runs and Tune
    state this one would mix with. ``dir_key`` is the setting that chose ``job.dir``
    (``sweep.dir`` for a sweep), named in the message so the user knows what to change. Returns
    the problems and the opened data (None where it can't be opened here), for
    :func:`data_repeats`.

    A dry run plans from the config alone (the data and the dir may live on a cluster this
    machine cannot see): it returns those problems as warnings instead, and a launch still stops.
    A task file that is here and wrong stops both: no cluster makes it right.
    """
    problems: list[str] = []

    def attempt(check: Callable[[], T]) -> T | None:
        try:
            return check()
        except TaskFormatError:
            raise
        except UserError as e:
            if not dry_run:
                raise
            problems.append(f"{e} (planned from the config; a launch stops here)")
            return None

    data = attempt(lambda: open_token_data(job.run.data, job.vocab_size, "vocab_size"))
    attempt(lambda: check_task_files(job.run.evals.tasks, job.run.evals.max_examples))
    attempt(lambda: check_output_dir(job.dir, dir_key))
    out = job.exp_dir
    found = recorded_experiment_kind(out)
    kind = experiment_kind(vars(job))
    if found not in (None, kind):
        raise ConfigError(
            f"{dir_key}: {str(out)!r} already holds a different experiment ({found}, see its "
            f"experiment.yaml); this {kind} would mix its runs with that one's: pick another "
            f"--{dir_key}"
        )
    return problems, data


DEMO_CORPUS = "the built-in demo corpus (Python standard library; run.data.shards sets yours)"


def data_line(data: TokenData | None, cfg: DataConfig) -> str:
    """What the runs will train on, said before they start: a forgotten ``run.data.shards``
    trains on the demo corpus without a word otherwise. ``data`` None: the preflight could not
    open it here (a dry run), so only the configured source is named."""
    if data is None:
        source = f"the mix {cfg.mix}" if cfg.mix else cfg.shards or DEMO_CORPUS
        return f"data: {source} (not opened here: see the warning below)"
    if data.spec.demo_tokenizer is not None:
        source = DEMO_CORPUS
    else:
        source = ", ".join(
            path if len(data.spec.sources) == 1 else f"{path} (weight {weight:g})"
            for path, weight in data.spec.sources
        )
    tokenizer = data.manifest.tokenizer
    val_tokens = sum(m.num_val_tokens for m in data.manifests)
    return (
        f"data: {source}, {tokenizer.kind} tokenizer (vocab {tokenizer.vocab_size:,}), "
        f"{data.num_train_tokens:,} train / {val_tokens:,} validation tokens"
    )


def data_repeats(data: TokenData | None, runs: list[tuple[str, TrainConfig]]) -> list[str]:
    """What the planned runs (name, config) would read twice (:meth:`TokenData.repeats`), each
    finding once with the runs it holds for; nothing without the data (the preflight could not
    open it here, and said so)."""
    if data is None:
        return []
    found: dict[str, list[str]] = {}
    for name, cfg in runs:
        for line in data.repeats(cfg.data.seq_len, *cfg.windows_read):
            found.setdefault(line, []).append(name)
    every = len(runs) > 1
    return [
        f"{'every run' if every and len(names) == len(runs) else ', '.join(names)}: {line}"
        for line, names in found.items()
    ]


def plot_ladder_schedule(job: LadderConfig, plans: list[SizePlan], path: Location) -> Location:
    """The LR schedule of the largest size (most parameters, wherever it is listed): the
    ladder's at a glance."""
    largest = max(plans, key=lambda p: p.num_params)
    title = f"{job.name} {largest.size}: LR schedule"
    return plot_schedule(largest.schedule, largest.steps, largest.lr, path, title=title)


def dry_run_plot_path(job: LadderConfig) -> Location:
    """In the experiment dir (where a launch draws it, once its checks pass) where
    :func:`_dry_run_may_write` allows, else ``./<name>-lr_schedule.png``: a dry run plans from
    the config alone."""
    if not _dry_run_may_write(job.exp_dir):
        return Path.cwd() / f"{job.name}-lr_schedule.png"
    return storage.join(job.exp_dir, LR_SCHEDULE)


def _dry_run_may_write(exp_dir: Location) -> bool:
    """This machine can write the dir, and doing so makes no tree of missing dirs: the dir or
    its parent exists, or it is the local default. A cluster's path (/mnt/shared/...) made on a
    workstation would later shadow the real mount point; a bucket has no dirs to make."""
    try:
        check_output_dir(exp_dir, "dir")
    except ConfigError:
        return False
    if storage.is_url(exp_dir):
        return True
    return exp_dir.parent.is_dir() or str(exp_dir) == canonical_output(LadderConfig.dir)


DRIVER_KEYS = frozenset({"ray.address"})
"""Settings of the launching process alone, which a resumed experiment does take."""
LOCATION_KEYS = frozenset({"dir", "sweep.dir"})
"""Where the experiment lives, not how its runs train: a copied or moved experiment resumes
where it is now (the record compared is the one found there), as a relaunch without
``--resume`` already does."""


PREDATING = {"min_rank_tokens": 0}
"""Top-level ladder keys added since experiments were first recorded -> the behaviour before
each: a record without one launched with that value (a new key with a new default must be added
here, or a resume of an older experiment would be refused, or replanned)."""


def as_launched(job: J, exp_dir: Location) -> J:
    """``job`` for a ``--resume`` of the experiment recorded in ``exp_dir``: each key in
    :data:`PREDATING` that its record lacks (launched before the key existed) and ``job`` leaves
    at its default takes the value it launched with, so the resume plans as the launch did."""
    record = storage.join(exp_dir, EXPERIMENT)
    if not storage.is_file(record):
        return job
    recorded = read_yaml_record(record)
    predating = {
        key: value
        for key, value in PREDATING.items()
        if key not in recorded and getattr(job, key) == getattr(type(job), key)
    }
    return replace(job, **predating) if predating else job


def write_experiment_record(
    job: LadderConfig, plans: list[SizePlan], exp_dir: Location, resume: bool = False
) -> None:
    """``experiment.yaml`` and ``plan.json``; on ``resume``, first refuse a config that differs
    from the recorded one, less :data:`DRIVER_KEYS` and :data:`LOCATION_KEYS`: Tune restores a
    trial with the config it was given at launch, so nothing else in a changed file would reach
    the resumed runs."""
    record = storage.join(exp_dir, EXPERIMENT)
    plan_file = storage.join(exp_dir, PLAN)
    if resume and storage.is_file(plan_file):
        launched = [row["size"] for row in read_json_record(plan_file, list)]
        planned = [p.size for p in plans]
        if sorted(set(launched)) != sorted(set(planned)):
            raise ConfigError(
                f"--resume: the sizes {', '.join(planned)} differ from the launch's "
                f"{', '.join(dict.fromkeys(launched))} ({plan_file}); Tune resumes the trials it "
                "launched, whatever --sizes says: resume with the launch's --sizes (none if it "
                "had none), or launch other sizes into a new --dir"
            )
    if resume and storage.is_file(record):
        recorded = read_yaml_record(record)
        ignored = DRIVER_KEYS | LOCATION_KEYS
        recorded = {**PREDATING, **recorded}
        changed = [k for k in changed_keys(recorded, to_dict(job)) if k not in ignored]
        if changed:
            verb = "differs" if len(changed) == 1 else "differ"
            raise ConfigError(
                f"--resume: {', '.join(changed)} {verb} from {record}; a resumed experiment "
                "trains each run with the config it was launched with, so the change would not "
                "take effect: undo it to resume, or launch the changed config into a new --dir"
            )
    storage.makedirs(exp_dir)
    write_atomic(record, to_yaml(job))
    rows = [{**p.table_row(job), "lr_source": p.lr_source, **p.hparam_record()} for p in plans]
    write_atomic(plan_file, json.dumps(rows, indent=2, default=str))
