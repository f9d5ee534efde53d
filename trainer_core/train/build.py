"""Build a training run from its config: device, mesh, model, optimizer, data, callbacks -> Trainer.

Shared by ``python -m trainer_core.train`` (single process / torchrun) and the Ray Train worker,
which passes its own batch source (Ray Data) and reporter callback.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch
from torch.distributed.device_mesh import DeviceMesh

from trainer_core.config.sections import TrainConfig
from trainer_core.data.token_data import open_token_data
from trainer_core.devices import peak_flops, peak_is_measured
from trainer_core.errors import RunWarning
from trainer_core.io import storage
from trainer_core.io.run_dir import RunInfo
from trainer_core.model.attention import check_attention_backend
from trainer_core.model.counts import count_params, num_flops_per_token
from trainer_core.parallel.float8 import float8_all_gather, keep_scales_current
from trainer_core.parallel.materialize import build_model
from trainer_core.parallel.mesh import dp_layout
from trainer_core.parallel.precision import autocast_precision, computes_in_16_bit
from trainer_core.parallel.process_group import init_distributed, resolve_device
from trainer_core.parallel.wrap import build_mesh, dp_mesh, uses_fsdp
from trainer_core.train.callbacks import Callback, ConsoleProgress, JsonlMetrics
from trainer_core.train.optim import build_optimizer
from trainer_core.train.schedule import build_scheduler
from trainer_core.train.task_eval import build_task_evaluator
from trainer_core.train.tracking import tracking_callbacks
from trainer_core.train.train_module import TrainModule
from trainer_core.train.trainer import Trainer

BatchSource = Callable[[int], Iterator[torch.Tensor]]


def run_info(cfg: TrainConfig, tags: dict | None = None) -> RunInfo:
    """The run's record; its size is the model's table name, else its ladder's or sweep's tag
    (a ladder's ``size_table`` size: the config holds its dims, not its name)."""
    return RunInfo(
        name=cfg.run_name,
        size=cfg.model.size or str((tags or {}).get("size", "")),
        num_params=count_params(cfg.model)["non_embedding"],
        flops_per_token=num_flops_per_token(cfg.model, cfg.data.seq_len),
        peak_lr=cfg.optim.lr,
        global_batch_tokens=cfg.trainer.global_batch_size,
        seq_len=cfg.data.seq_len,
        total_steps=cfg.total_steps,
        tags=tags or {},
    )


def build_train_module(
    cfg: TrainConfig, device: torch.device, mesh: DeviceMesh | None, dp_size: int
) -> TrainModule:
    """The model (seeded, then float8 / TP / AC / compile / FSDP as configured), its optimizer,
    LR schedule and train module: what a run trains, and what the benchmarks measure."""
    fsdp = uses_fsdp(mesh)  # the rule parallelize_model applies
    check_attention_backend(
        cfg.model.attention_backend, device, computes_in_16_bit(cfg.parallel, cfg.train_module)
    )
    torch.manual_seed(cfg.trainer.seed)  # the same global RNG on every rank
    model = build_model(cfg.model, cfg.data.seq_len, mesh, cfg.parallel, device, cfg.trainer.seed)
    optimizer = build_optimizer(model, cfg.optim, device)
    after_load = None
    if float8_all_gather(cfg.parallel, fsdp):
        after_load = keep_scales_current(model, optimizer)
    scheduler = build_scheduler(optimizer, cfg.schedule, cfg.total_steps)
    autocast = autocast_precision(cfg.parallel, cfg.train_module, fsdp=fsdp)
    return TrainModule(
        model,
        optimizer,
        scheduler,
        replace(cfg.train_module, autocast_precision=autocast),
        seq_len=cfg.data.seq_len,
        device=device,
        dp_group=dp_mesh(mesh).get_group() if mesh is not None else None,
        dp_size=dp_size,
        after_load=after_load,
    )


def build_trainer(
    cfg: TrainConfig,
    *,
    train_batches: BatchSource | None = None,
    extra_callbacks: list[Callback] | None = None,
    tags: dict | None = None,
    placement: dict[str, str] | None = None,
) -> Trainer:
    """The run a config describes, ready to ``fit()``: device, process group and mesh, the
    wrapped model, optimizer and schedule, data for this rank, callbacks, checkpointer.

    One function for ``python -m trainer_core.train``, ``torchrun`` and the Ray Train worker, so
    a run is built the same way everywhere; the Ray layer passes its own ``train_batches``
    (Ray Data) and callbacks (reporting), and ``placement`` for ``run.json``.
    """
    device = resolve_device(cfg.trainer.device)
    dist_info = init_distributed(device.type)
    device = dist_info.device
    layout = dp_layout(cfg.parallel, dist_info.world_size, dist_info.rank)
    cfg.check_dp_split(layout.dp_size)
    mesh = build_mesh(cfg.parallel, dist_info.world_size, device.type)
    if mesh is not None:
        dp = dp_mesh(mesh)
        assert (dp.get_local_rank(), dp.size()) == (layout.dp_rank, layout.dp_size), "mesh order"
    dp_rank, dp_size = layout.dp_rank, layout.dp_size
    seq_len = cfg.data.seq_len
    batch_seqs = cfg.batch_seqs
    module = build_train_module(cfg, device, mesh, dp_size)

    data = open_token_data(cfg.data, cfg.model.vocab_size)
    if train_batches is None:

        def train_batches(start_step: int) -> Iterator[torch.Tensor]:
            return data.train_batches(
                seq_len, batch_seqs, cfg.trainer.seed, start_step, dp_rank, dp_size
            )

    eval_batches = data.eval_batches(
        seq_len, batch_seqs, cfg.trainer.eval_batches, dp_rank, dp_size
    )
    task_evaluator = build_task_evaluator(cfg, data.manifest, dp_rank, dp_size)

    info = replace(run_info(cfg, tags), data_id=data.content_id)
    callbacks: list[Callback] = []
    if dist_info.rank == 0:
        for line in data.repeats(seq_len, *cfg.windows_read):
            warnings.warn(line, RunWarning, stacklevel=2)
        run_dir = cfg.trainer.run_location
        storage.makedirs(run_dir)
        if cfg.trainer.progress:
            callbacks.append(ConsoleProgress(info.name))
        callbacks.append(JsonlMetrics(run_dir))
        callbacks.extend(tracking_callbacks(cfg, info))
    callbacks.extend(extra_callbacks or [])
    return Trainer(
        cfg,
        module,
        train_batches=train_batches,
        eval_batches=eval_batches,
        info=info,
        rank=dist_info.rank,
        world_size=dist_info.world_size,
        peak_flops=peak_flops(device, cfg.trainer.peak_flops_per_device),
        peak_measured=peak_is_measured(device, cfg.trainer.peak_flops_per_device),
        callbacks=callbacks,
        placement=placement,
        task_evaluator=task_evaluator,
    )
