"""FSDP2, tensor parallel and 2D runs on CPU (gloo) match a single process step for step."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer_core.config import (
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    ScheduleConfig,
    TrainModuleConfig,
)
from trainer_core.configio import ConfigError
from trainer_core.model import Transformer
from trainer_core.optim import build_optimizer
from trainer_core.parallel import build_mesh, dp_mesh, dp_rank_and_size, parallelize_model
from trainer_core.schedule import build_scheduler
from trainer_core.train_module import TrainModule

SEQ, BATCH, STEPS = 16, 8, 10
MODEL = ModelConfig(size="", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=128)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(parallel: ParallelConfig, world: int, rank: int) -> dict[str, list[float]]:
    mesh = build_mesh(parallel, world, "cpu")
    torch.manual_seed(0)
    model = parallelize_model(Transformer(MODEL, SEQ), mesh, parallel, torch.device("cpu"))
    opt = build_optimizer(model, OptimConfig(lr=3e-3), torch.device("cpu"))
    sched = build_scheduler(opt, ScheduleConfig(kind="cosine", warmup=2), STEPS)
    dp_rank, dp_size = dp_rank_and_size(mesh)
    module = TrainModule(
        model,
        opt,
        sched,
        TrainModuleConfig(max_grad_norm=0.5),
        seq_len=SEQ,
        device=torch.device("cpu"),
        dp_group=dp_mesh(mesh).get_group() if mesh is not None else None,
        dp_size=dp_size,
    )
    g = torch.Generator().manual_seed(1)
    losses, norms = [], []
    per_rank = BATCH // dp_size
    for _ in range(STEPS):
        batch = torch.randint(0, MODEL.vocab_size, (BATCH, SEQ + 1), generator=g)
        stats = module.train_batch(batch[dp_rank * per_rank : (dp_rank + 1) * per_rank])
        norms.append(module.optim_step().item())
        module.zero_grads()
        pair = torch.stack([stats.ce_sum, stats.num_tokens.float()])
        if dp_size > 1:
            dist.all_reduce(pair, group=module.dp_group)
        losses.append((pair[0] / pair[1]).item())
    return {"loss": losses, "grad_norm": norms}


def _worker(rank: int, world: int, port: int, parallel: ParallelConfig, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = train(parallel, world, rank)
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def single() -> dict[str, list[float]]:
    return train(ParallelConfig(), 1, 0)


@pytest.mark.parametrize(
    "world, parallel",
    [
        (2, ParallelConfig()),  # FSDP2 over 2 ranks
        (2, ParallelConfig(tp=2)),  # tensor parallel
        (4, ParallelConfig(dp_shard=2, tp=2)),  # 2D: FSDP x TP
        (2, ParallelConfig(dp_replicate=2, dp_shard=1)),  # HSDP's replicate dimension
    ],
    ids=["fsdp2", "tp2", "fsdp2xtp2", "replicate2"],
)
def test_distributed_matches_single_process(single, tmp_path, world, parallel):
    out = tmp_path / "result.json"
    mp.spawn(_worker, args=(world, free_port(), parallel, str(out)), nprocs=world, join=True)
    result = json.loads(out.read_text())
    for key in ("loss", "grad_norm"):
        for step, (a, b) in enumerate(zip(result[key], single[key], strict=True)):
            assert a == pytest.approx(b, abs=1e-4), (key, step)


@pytest.mark.parametrize(
    "parallel, world, message",
    [
        (
            ParallelConfig(tp=3),
            4,
            "parallel.tp: dp_replicate=1 x tp=3 does not divide the world size 4",
        ),
        (
            ParallelConfig(dp_shard=3),
            4,
            "parallel.dp_shard: dp_replicate=1 x dp_shard=3 x tp=1 = 3 devices",
        ),
    ],
)
def test_bad_mesh_is_a_config_error(parallel, world, message):
    with pytest.raises(ConfigError) as err:
        build_mesh(parallel, world, "cpu")
    assert message in str(err.value)
