"""The device mesh as numbers (no torch): its shape for a world size and each rank's place in it.

The planner, the Ray layer, the worker and the trainer all ask :func:`dp_layout`, so the DP size
a plan prints is the one the run splits its batch by. The mesh is (dp_replicate, dp_shard, tp)
with tp innermost: the ranks of a TP group are neighbours (one node), and a rank's data-parallel
index is ``rank // tp``.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import ParallelConfig

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")


def mesh_shape(cfg: ParallelConfig, world_size: int) -> tuple[int, int, int]:
    """``(dp_replicate, dp_shard, tp)`` for ``world_size`` devices, resolving ``dp_shard=-1``.

    Raises a ConfigError naming the field that does not fit the world size.
    """
    for name in ("tp", "dp_replicate"):
        value = getattr(cfg, name)
        if world_size % value:
            raise ConfigError(f"parallel.{name}: {value} does not divide world size {world_size}")
    fixed = cfg.dp_replicate * cfg.tp
    if world_size % fixed:
        raise ConfigError(
            f"parallel.tp: dp_replicate x tp = {cfg.dp_replicate} x {cfg.tp} = {fixed} does not "
            f"divide world size {world_size}"
        )
    shard = world_size // fixed if cfg.dp_shard == -1 else cfg.dp_shard
    if fixed * shard != world_size:
        raise ConfigError(
            f"parallel.dp_shard: dp_replicate x dp_shard x tp = {cfg.dp_replicate} x {shard} x "
            f"{cfg.tp} = {fixed * shard} devices, but world size is {world_size}; "
            "set dp_shard=-1 to use every remaining device"
        )
    return cfg.dp_replicate, shard, cfg.tp


@dataclass(frozen=True)
class DPLayout:
    """Where a rank sits in the mesh, as data parallelism sees it."""

    replicate: int
    shard: int
    tp: int
    dp_rank: int

    @property
    def dp_size(self) -> int:
        """Ranks that see different data (replicate x shard)."""
        return self.replicate * self.shard


def dp_layout(cfg: ParallelConfig, world_size: int, rank: int = 0) -> DPLayout:
    """The one rule for the data-parallel layout of ``world_size`` ranks (see the module doc)."""
    replicate, shard, tp = mesh_shape(cfg, world_size)
    return DPLayout(replicate=replicate, shard=shard, tp=tp, dp_rank=rank // tp)
