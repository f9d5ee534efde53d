"""Experiment tracking through the real ``wandb`` library.

Offline by default: runs are written under ``<run_dir>/wandb`` and can be uploaded later with
``wandb sync <run_dir>/wandb/offline-run-*``. W&B writes to a local dir only, so a run dir on
object storage gets its ``wandb/`` files from a node-local stage, uploaded before each checkpoint
and when the loop ends. Online only when asked for (``tracking.mode: online``) and an API key is
available. Only rank 0 logs. The logged config is the resolved
TrainConfig, which holds no secrets (W&B reads its key from the environment / netrc).
``wandb`` (2 s to import) is imported when a tracked run starts, never by untracked ones.

A resumed run continues its W&B run (the id: the run dir's name and its first start) and logs only the
steps past those it logged before: steps replayed after a resume from a checkpoint keep the
values first logged (the same losses; ``metrics.jsonl`` holds the replay's throughput), so
W&B's steps only increase. "Logged before" is the last step handed to W&B (``LOGGED_STEP``),
offline capped by the last step its segments' files hold (:mod:`~trainer_core.train.wandb_files`):
W&B's service writes in blocks seconds apart, and a kill loses the rows it still held, which
the resumed run then logs again from its checkpoint.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from trainer_core.config.decode import ConfigError
from trainer_core.config.loader import to_dict
from trainer_core.config.sections import TrainConfig
from trainer_core.io import storage
from trainer_core.io.run_dir import LOGGED_STEP, WANDB, worker_groups
from trainer_core.io.storage import Location
from trainer_core.train.callbacks import BaseCallback
from trainer_core.train.wandb_files import SEGMENTS, last_step_written

log = logging.getLogger(__name__)


class WandbCallback(BaseCallback):
    def __init__(self, cfg: TrainConfig, info: Any):
        self.cfg, self.info = cfg, info
        self.run = None
        self.local_dir: Path | None = None
        self.marker: Path | None = None
        self.logged_step = 0
        self.uploaded: storage.FileStamps | None = None

    def on_start(self, info: dict[str, Any]) -> None:
        import wandb

        t = self.cfg.tracking
        run_dir = self.cfg.trainer.run_location
        self.local_dir = (
            storage.upload_cache_dir(str(run_dir), WANDB) if storage.is_url(run_dir) else None
        )
        if wandb.run is not None:
            # A process that trains runs one after another (a reused Tune trial) may still hold
            # one that stopped early, without on_end: this run's metrics must not go into it.
            # Torn down as on_end does, so its rows are in its files before they are read below.
            wandb.run.finish()
            wandb.teardown()
        mode = t.mode
        if mode == "online" and not (os.environ.get("WANDB_API_KEY") or _has_netrc_key()):
            print("[wandb] no API key found: logging offline (sync later with `wandb sync`)")
            mode = "offline"
        wandb_root = Path(self.local_dir or run_dir)
        run_id = _run_id(run_dir)
        self.marker = wandb_root / WANDB / LOGGED_STEP
        here = _read_marker(self.marker.read_text() if self.marker.is_file() else "")
        if self.local_dir is not None and here[0] not in ("", run_id):
            # the node's stage of an earlier run at this URL (deleted and reused since): its
            # files would be uploaded into this run's dir and its marker skip this run's steps
            shutil.rmtree(self.local_dir / WANDB)
        uploaded = storage.join(run_dir, WANDB, LOGGED_STEP)
        there = ("", 0)
        if self.local_dir is not None and storage.is_file(uploaded):
            there = _read_marker(storage.read_text(uploaded))  # this run's rank 0 on another node
        self.logged_step = max((step for i, step in (here, there) if i == run_id), default=0)
        if mode == "offline":
            # Handed to W&B is not written: a kill loses the rows its service still held.
            written = last_step_written(_segment_files(wandb_root, run_dir), run_id)
            if written is not None:
                self.logged_step = min(self.logged_step, written)
        self.run = wandb.init(
            project=t.project,
            entity=t.entity or None,
            group=t.group or None,
            name=t.name or self.info.name,
            id=run_id,
            resume="allow",
            tags=t.tags or None,
            dir=str(wandb_root),
            mode=mode,
            config={**to_dict(self.cfg), "run_info": self.info.__dict__},
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        if self.run is not None and step > self.logged_step:
            self.run.log(metrics, step=step, commit=True)
            self.logged_step = step
            storage.write_atomic(self.marker, f"{self.run.id} {step}")

    def flush(self) -> None:
        """Before each checkpoint and when the loop ends, however it ends: a run dir on object
        storage gets W&B's files as they are (a run killed, stopped early or diverged never
        reaches ``on_end``). A failed upload is logged, not raised: it must not replace the
        error the loop is ending with, and ``metrics.jsonl`` holds every row."""
        if self.run is not None and self.local_dir is not None:
            try:
                self._upload()
            except Exception as e:  # noqa: BLE001 (an object store's own errors too)
                log.warning("W&B files not uploaded to %s: %s", self.cfg.trainer.run_dir, e)

    def _upload(self) -> None:
        run_dir = self.cfg.trainer.run_dir
        target = storage.join(run_dir, WANDB)
        self.uploaded = storage.upload_dir(self.local_dir / WANDB, target, self.uploaded)

    def on_end(self, summary: dict[str, Any]) -> None:
        if self.run is not None:
            import wandb

            self.run.summary.update({k: v for k, v in summary.items() if k != "name"})
            self.run.finish()
            # finish() returns before W&B's service has written the last rows to the run's
            # files; teardown waits for it (and removes its temp dirs), so they are complete
            # when uploaded below or read by whatever runs next.
            wandb.teardown()
            self.run = None
        if self.local_dir is not None:
            self._upload()


def _segment_files(wandb_root: Path, run_dir: Location) -> list[bytes]:
    """The ``.wandb`` files of the run's earlier offline segments: in the local W&B dir and,
    for a run dir on object storage, those uploaded there from other nodes."""
    local = sorted((wandb_root / WANDB).glob(f"{SEGMENTS}/*.wandb"))
    files = [path.read_bytes() for path in local]
    if storage.is_url(run_dir):
        here = {path.parent.name for path in local}  # uploaded from here: the same or older
        remote = storage.join(run_dir, WANDB)
        for segment, size in storage.entries(remote).items():
            if size is None and fnmatch(segment, SEGMENTS) and segment not in here:
                names = storage.entries(storage.join(remote, segment))
                files += [
                    storage.read_bytes(storage.join(remote, segment, name))
                    for name in names
                    if name.endswith(".wandb")
                ]
    return files


def _run_id(run_dir: Location) -> str:
    """One W&B run per run: a resumed run continues it, also from a copy of its experiment
    moved elsewhere (the dir's name, not its path), while a new run in a reused dir (the old one
    deleted) starts its own, as its first start's time differs."""
    groups = worker_groups(run_dir)
    first = f"{groups[0].time!r}" if groups else ""
    return hashlib.sha1(f"{storage.name(run_dir)}@{first}".encode()).hexdigest()[:16]


def _read_marker(text: str) -> tuple[str, int]:
    """(run id, step) of a :data:`LOGGED_STEP` file; ("", 0) for none or a torn one."""
    parts = text.split()
    if len(parts) == 2 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return "", 0


def _has_netrc_key() -> bool:
    netrc = Path.home() / ".netrc"
    return netrc.exists() and "api.wandb.ai" in netrc.read_text()


def tracking_callbacks(cfg: TrainConfig, info: Any) -> list[BaseCallback]:
    """W&B's callback when tracked, checked before the run starts: a missing package or a
    ``wandb`` file where W&B writes its dir would fail only once the model is built."""
    if not cfg.tracking.wandb or cfg.tracking.mode == "disabled":
        return []
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "tracking.wandb: true needs the wandb package: pip install wandb, or set "
            "--tracking.wandb=false"
        )
    run_dir = cfg.trainer.run_location
    if not storage.is_url(run_dir) and (Path(run_dir) / WANDB).is_file():
        raise ConfigError(
            f"tracking.wandb: {Path(run_dir) / WANDB} is a file where W&B writes its dir: "
            "move it, or set --tracking.wandb=false"
        )
    return [WandbCallback(cfg, info)]
