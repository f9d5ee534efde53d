"""Experiment tracking through the real ``wandb`` library.

Offline by default: runs are written under ``<run_dir>/wandb`` and can be uploaded later with
``wandb sync <run_dir>/wandb/offline-run-*``. W&B writes to a local dir only, so a run dir on
object storage gets its ``wandb/`` files from a node-local stage when the run ends. Online only when asked for (``tracking.mode:
online``) and an API key is available. Only rank 0 logs. The logged config is the resolved
TrainConfig, which holds no secrets (W&B reads its key from the environment / netrc).
``wandb`` (2 s to import) is imported when a tracked run starts, never by untracked ones.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from trainer_core.config.loader import to_dict
from trainer_core.config.sections import TrainConfig
from trainer_core.io import storage
from trainer_core.io.storage import Location
from trainer_core.train.callbacks import BaseCallback


class WandbCallback(BaseCallback):
    def __init__(self, cfg: TrainConfig, info: Any):
        self.cfg, self.info = cfg, info
        self.run = None
        self.local_dir: Path | None = None

    def on_start(self, info: dict[str, Any]) -> None:
        import wandb

        t = self.cfg.tracking
        run_dir = self.cfg.trainer.run_location
        self.local_dir = (
            storage.upload_cache_dir(str(run_dir), "wandb") if storage.is_url(run_dir) else None
        )
        if wandb.run is not None:
            # A process that trains runs one after another (a reused Tune trial) may still hold
            # one that stopped early, without on_end: this run's metrics must not go into it.
            wandb.run.finish()
        mode = t.mode
        if mode == "online" and not (os.environ.get("WANDB_API_KEY") or _has_netrc_key()):
            print("[wandb] no API key found: logging offline (sync later with `wandb sync`)")
            mode = "offline"
        self.run = wandb.init(
            project=t.project,
            entity=t.entity or None,
            group=t.group or None,
            name=t.name or self.info.name,
            id=_stable_id(run_dir),
            resume="allow",
            tags=t.tags or None,
            dir=str(self.local_dir or run_dir),
            mode=mode,
            config={**to_dict(self.cfg), "run_info": self.info.__dict__},
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def on_end(self, summary: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update({k: v for k, v in summary.items() if k != "name"})
            self.run.finish()
            self.run = None
        if self.local_dir is not None:
            run_dir = self.cfg.trainer.run_dir
            storage.upload_dir(self.local_dir / "wandb", storage.join(run_dir, "wandb"))


def _stable_id(run_dir: Location) -> str:
    """One W&B run per run dir, so a resumed run continues the same W&B run."""
    return hashlib.sha1(str(run_dir).encode()).hexdigest()[:16]


def _has_netrc_key() -> bool:
    netrc = Path.home() / ".netrc"
    return netrc.exists() and "api.wandb.ai" in netrc.read_text()


def tracking_callbacks(cfg: TrainConfig, info: Any) -> list[BaseCallback]:
    if not cfg.tracking.wandb or cfg.tracking.mode == "disabled":
        return []
    return [WandbCallback(cfg, info)]
