"""A rank of a tiny run built by ``build_trainer`` (as ``torchrun`` would start it), reporting
what the precision and float8 switches did: for ``spawn_ranks`` in the tests that need FSDP."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from ranks import join_as_rank

from trainer_core.config.loader import load_config
from trainer_core.config.sections import TrainConfig
from trainer_core.parallel.process_group import teardown
from trainer_core.train.build import build_trainer

TINY = (
    "--model.n_layers=2",
    "--data.seq_len=64",
    "--trainer.global_batch_size=512",
    "--trainer.max_steps=10",
    "--trainer.log_interval=5",
    "--trainer.eval_interval=10",
    "--trainer.eval_batches=2",
    "--trainer.device=cpu",
    "--trainer.progress=false",
    "--checkpoint.enabled=false",
)
"""tests/conftest.py's tiny run, 10 steps, on CPU, without checkpoints."""
SHORT = ("--trainer.max_steps=4", "--trainer.log_interval=2", "--trainer.eval_interval=4")
"""The tiny run cut to 4 steps, for the slow paths (bf16 and emulated float8 casts on CPU)."""


def observe(overrides: list[str]) -> dict:
    """Build and fit the tiny run, then one more forward/backward watched by hooks: the dtypes a
    block linear computes in, holds and gets gradients in, and what float8 converted."""
    cfg = load_config(TrainConfig, None, [*TINY, *overrides])
    trainer = build_trainer(cfg)
    model = trainer.module.model
    summary = trainer.fit()
    seen = {}
    linear = model.blocks["0"].mlp.w_up

    def record(module, inputs, output) -> None:
        seen.update(input=str(inputs[0].dtype), output=str(output.dtype))

    linear.register_forward_hook(record)
    trainer.module.train_batch(next(trainer.train_batches(0)))
    float8 = [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    weights = [
        getattr(m.weight, "_local_tensor", m.weight)
        for m in model.modules()
        if isinstance(getattr(m, "weight", None), torch.Tensor)
    ]
    return {
        "autocast": str(trainer.module.autocast_dtype),
        "linear_input": seen["input"],
        "linear_output": seen["output"],
        "params": sorted({str(p.dtype) for p in model.parameters()}),
        "grads": sorted({str(p.grad.dtype) for p in model.parameters()}),
        "float8_linears": float8,
        "float8_weight_types": sorted(
            {type(w).__name__ for w in weights if type(w).__name__.startswith("Weight")}
        ),
        "precomputed_scales": sum(
            getattr(w, "_precomputed_scale", None) is not None for w in weights
        ),
        "loss": summary["train/loss_last"],
        "eval_loss": summary["eval/loss"],
    }


def rank_worker(rank: int, world: int, port: int, overrides: list[str], out: str) -> None:
    join_as_rank(rank, world, port)
    try:
        result = observe([*overrides, f"--trainer.run_dir={Path(out).parent / 'run'}"])
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        teardown()
