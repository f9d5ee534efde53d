"""Sharded checkpoints: atomic commit, Levanter-style keep policy, safe loading, listing.

Layout: ``<run_dir>/checkpoints/step-XXXXXXXX/`` written with ``torch.distributed.checkpoint``
(every rank writes its own shards). Every rank writes into ``step-N.tmp`` and drops a marker
``.done-rank{r}-of-{W}`` when its part is on disk; after a barrier rank 0 renames the dir. A
checkpoint is complete iff it has DCP's ``.metadata`` and all W markers, so a crash at any moment
leaves either the previous checkpoints or a complete new one, never a half-written "latest".
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from trainer_core.config import CheckpointConfig

STEP_DIR = re.compile(r"^step-(\d{8})$")
Decision = Literal["none", "temporary", "permanent"]


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupt, or does not fit the current model."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    tokens: int
    path: Path
    complete: bool
    permanent: bool
    metrics_path: Path | None


def step_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step:08d}"


def missing_parts(path: Path) -> list[str]:
    """What keeps ``path`` from being a complete checkpoint (empty list: complete)."""
    if not path.is_dir():
        return ["the directory"]
    missing = [] if (path / ".metadata").exists() else [".metadata"]
    markers = list(path.glob(".done-rank*-of-*"))
    if not markers:
        return [*missing, "rank markers (.done-rank*-of-*)"]
    world = int(markers[0].name.rsplit("-", 1)[1])
    have = {m.name for m in markers}
    missing += [f".done-rank{r}-of-{world}" for r in range(world) if f".done-rank{r}-of-{world}" not in have]
    return missing


def _info(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "info.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def list_checkpoints(run_dir: str | Path) -> list[CheckpointInfo]:
    """Every ``step-N`` checkpoint dir of a run, sorted by step (``.tmp`` dirs are not listed)."""
    root = Path(run_dir) / "checkpoints"
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        match = STEP_DIR.match(path.name)
        if not match:
            continue
        step = int(match.group(1))
        info = _info(path)
        metrics = Path(run_dir) / f"metrics_step{step}.json"
        found.append(
            CheckpointInfo(
                step=step,
                tokens=int(info.get("tokens", 0)),
                path=path,
                complete=not missing_parts(path),
                permanent=bool(info.get("permanent", False)),
                metrics_path=metrics if metrics.exists() else None,
            )
        )
    return found


def latest_complete(run_dir: str | Path) -> CheckpointInfo | None:
    """The newest complete checkpoint; incomplete ones are skipped with a warning naming them."""
    for info in reversed(list_checkpoints(run_dir)):
        if info.complete:
            return info
        warnings.warn(
            f"skipping incomplete checkpoint {info.path} (missing {', '.join(missing_parts(info.path))})",
            stacklevel=2,
        )
    return None


# -- RNG ------------------------------------------------------------------------------------------


def rng_state(rank: int) -> dict[str, Any]:
    """This rank's RNG states under a per-rank key (DCP would otherwise keep only rank 0's)."""
    state = {
        "python": torch.tensor(list(random.getstate()[1]), dtype=torch.int64),
        "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return {f"rank{rank}": state}


def restore_rng(states: dict[str, Any], rank: int) -> None:
    state = states.get(f"rank{rank}")
    if state is None:
        return  # resumed on a wider world: new ranks keep their fresh seeds
    py = tuple(int(x) for x in state["python"].tolist())
    random.setstate((3, py, None))
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), 0, 0, 0.0))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# -- policy ---------------------------------------------------------------------------------------


class CheckpointPolicy:
    """Temporary checkpoints every N steps / M minutes; permanent ones by ``keep`` rules + steps."""

    def __init__(self, cfg: CheckpointConfig):
        self.cfg = cfg
        self.last_time = time.time()

    def is_permanent(self, step: int) -> bool:
        if step in self.cfg.keep_steps:
            return True
        previous_until = 0
        for rule in self.cfg.keep:
            until = rule.until if rule.until is not None else float("inf")
            if previous_until < step <= until:
                return step % rule.every == 0
            previous_until = until
        return False

    def decide(self, step: int, now: float) -> Decision:
        if self.is_permanent(step):
            return "permanent"
        by_steps = self.cfg.save_interval_steps and step % self.cfg.save_interval_steps == 0
        minutes = self.cfg.save_interval_minutes
        by_time = minutes is not None and now - self.last_time >= 60 * minutes
        return "temporary" if by_steps or by_time else "none"

    def decide_all_ranks(self, step: int, now: float) -> Decision:
        """Rank 0's decision for everyone (clocks differ; a save needs every rank)."""
        decision = self.decide(step, now)
        if dist.is_initialized() and dist.get_world_size() > 1 and self.cfg.save_interval_minutes:
            box = [decision]
            dist.broadcast_object_list(box, src=0)
            decision = box[0]
        return decision

    def saved(self, now: float) -> None:
        self.last_time = now


# -- save / load ----------------------------------------------------------------------------------


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's planner unpickles non-tensor items with ``weights_only=False``; we never do."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _flat_shapes(state: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    flat, _ = flatten_state_dict(state)
    return {k: tuple(v.shape) for k, v in flat.items() if isinstance(v, torch.Tensor)}


def check_compatible(path: Path, state: dict[str, Any]) -> None:
    """Compare saved tensor shapes with the current state before loading a byte."""
    reader = dcp.FileSystemReader(str(path))
    try:
        saved = reader.read_metadata().state_dict_metadata
    except Exception as e:  # a truncated or foreign .metadata file
        raise CheckpointError(f"checkpoint {path} has an unreadable .metadata ({e})") from None

    saved_shapes = {
        k: tuple(v.size) for k, v in saved.items() if isinstance(v, TensorStorageMetadata)
    }
    current = {}
    for key, value in state.items():
        sd = value.state_dict() if hasattr(value, "state_dict") else value
        current.update({f"{key}.{k}": s for k, s in _flat_shapes(sd).items()})
    model_keys = {k for k in current if ".model." in f".{k}"}
    missing = sorted(k for k in model_keys if k not in saved_shapes)
    wrong = sorted(
        f"{k}: checkpoint {saved_shapes[k]} vs model {current[k]}"
        for k in model_keys
        if k in saved_shapes and saved_shapes[k] != current[k]
    )
    unexpected = sorted(
        k for k in saved_shapes if ".model." in f".{k}" and k not in current
    )
    if missing or wrong or unexpected:
        lines = [f"checkpoint {path} does not match the model:"]
        lines += [f"  shape mismatch {w}" for w in wrong[:20]]
        lines += [f"  missing in checkpoint: {k}" for k in missing[:20]]
        lines += [f"  not in model: {k}" for k in unexpected[:20]]
        raise CheckpointError("\n".join(lines))


class Checkpointer:
    def __init__(self, run_dir: str | Path, cfg: CheckpointConfig, rank: int = 0, world_size: int = 1):
        self.run_dir, self.cfg = Path(run_dir), cfg
        self.rank, self.world_size = rank, world_size
        self.root = self.run_dir / "checkpoints"

    def save(
        self,
        step: int,
        app_state: dict[str, Any],
        *,
        tokens: int,
        permanent: bool,
        metrics: dict[str, Any] | None = None,
    ) -> Path:
        final = step_dir(self.run_dir, step)
        tmp = final.with_name(final.name + ".tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        dcp.save(app_state, checkpoint_id=str(tmp))
        (tmp / f".done-rank{self.rank}-of-{self.world_size}").touch()
        if self.rank == 0:
            info = {"step": step, "tokens": tokens, "world_size": self.world_size,
                    "permanent": permanent, "time": time.time()}
            (tmp / "info.json").write_text(json.dumps(info))
        self._barrier()
        if self.rank == 0:
            self._commit(tmp, final)
            if metrics is not None and permanent:
                (self.run_dir / f"metrics_step{step}.json").write_text(json.dumps(metrics, indent=2))
            self._drop_old_temporaries(keep=final)
        self._barrier()
        return final

    def _commit(self, tmp: Path, final: Path) -> None:
        if final.exists():  # re-saving a step after a resume: swap, never delete first
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)

    def _drop_old_temporaries(self, keep: Path) -> None:
        for info in list_checkpoints(self.run_dir):
            if info.path != keep and info.complete and not info.permanent:
                shutil.rmtree(info.path, ignore_errors=True)

    def load(self, path: str | Path, app_state: dict[str, Any]) -> None:
        path = Path(path)
        if not path.exists():
            raise CheckpointError(f"checkpoint {path} does not exist")
        missing = missing_parts(path)
        if missing:
            raise CheckpointError(
                f"checkpoint {path} is incomplete (missing {', '.join(missing)}); pick an earlier one"
            )
        check_compatible(path, app_state)
        try:
            dcp.load(app_state, checkpoint_id=str(path), planner=_SafeLoadPlanner())
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"checkpoint {path} could not be read ({type(e).__name__}: {e})") from None

    def latest(self) -> CheckpointInfo | None:
        return latest_complete(self.run_dir)

    def close(self) -> None:
        """Kept for symmetry with async saving: nothing is in flight after a synchronous save."""

    def _barrier(self) -> None:
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()
