"""float8 training (torchao) of the transformer blocks' linear layers (``parallel.float8``).

The blocks' matmuls are nearly all of a step's FLOPs, and an H100 runs them twice as fast in
float8. The embedding (a lookup) and the LM head (whose logits feed a softmax that float8's
range would clip) stay in bf16, as in torchtitan and OLMo-core, and so does any linear layer
whose dims are not multiples of 16 (float8 kernels need them). The recipes: "tensorwise" (one
scale per tensor, fastest) and "rowwise" (one per row, more robust to outliers, H100 only).

Converted first, before TP, AC, compile and FSDP (torchtitan's order), so that compile traces
the float8 casts into the blocks' graphs and FSDP shards the converted weights. Under FSDP the
tensorwise recipe all-gathers weights already cast to float8 (half of bf16's traffic), their
scales computed for every layer with one all-reduce after each optimizer step. torchao is
imported only here and only when float8 is on (``pip install -e '.[gpu]'``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from collections.abc import Callable

import torch
from torch import nn

from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import ParallelConfig
from trainer_core.devices import require_capability
from trainer_core.errors import RunWarning

MIN_CAPABILITY = {"tensorwise": (8, 9), "rowwise": (9, 0)}
"""CUDA compute capability each recipe needs: float8 tensor cores (Ada 8.9, Hopper 9.0);
row-wise scaled matmuls exist from Hopper on."""


def check_float8(cfg: ParallelConfig, device: torch.device) -> None:
    """Fail in one line, before any conversion, when this install or device can't run float8."""
    where = f"parallel.float8: {cfg.float8!r}"
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(
            f"{where} needs torchao, which is not installed: pip install -e '.[gpu]' "
            "(or set parallel.float8=none)"
        )
    if cfg.float8_emulate:
        return
    if device.type != "cuda":
        raise ConfigError(
            f"{where} needs a CUDA GPU (H100, H200, Ada or newer) and this run is on "
            f"{device.type}: set parallel.float8=none (or parallel.float8_emulate=true to test)"
        )
    check_capability(
        cfg.float8, torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
    )


def check_capability(recipe: str, gpu_name: str, capability: tuple[int, int]) -> None:
    """Refuse, naming the GPU, a ``recipe`` that a GPU of this compute ``capability`` can't run."""
    require_capability(
        f"parallel.float8: {recipe!r}",
        MIN_CAPABILITY[recipe],
        gpu_name,
        capability,
        "set parallel.float8=none (bf16) on this GPU",
    )


def converts(module: nn.Module, fqn: str) -> bool:
    """The filter: a linear layer inside a block whose dims are multiples of 16."""
    return (
        fqn.startswith("blocks.")
        and isinstance(module, nn.Linear)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def rowwise_pays_off(module: nn.Linear) -> bool:
    """Whether row-wise float8 beats bf16 on an H100 for a linear of this shape, by the
    thresholds of torchao's row-wise benchmark table (its float8 README): more than 2048 output
    features, more than 1024 input features, and not both at most 4096 outputs and 2048
    inputs. At 1B that converts the MLP's gate and up projections (2048 -> 8192) and keeps the
    attention projections (2048 -> 2048) and the MLP's down projection (8192 -> 2048) in bf16.
    Our own rule, not torchao's filter function, which is private and absent before 0.11."""
    outputs, inputs = module.out_features, module.in_features
    return outputs > 2048 and inputs > 1024 and (outputs > 4096 or inputs > 2048)


def float8_filter(cfg: ParallelConfig) -> Callable[[nn.Module, str], bool]:
    """Which linears a recipe converts: :func:`converts`, and for "rowwise" only those where
    :func:`rowwise_pays_off`."""
    if cfg.float8 != "rowwise":
        return converts
    return lambda module, fqn: converts(module, fqn) and rowwise_pays_off(module)


def float8_all_gather(cfg: ParallelConfig, fsdp: bool) -> bool:
    """FSDP all-gathers float8 weights: only with one scale per tensor (torchao's limit)."""
    return fsdp and cfg.float8 == "tensorwise"


def convert_to_float8(model: nn.Module, cfg: ParallelConfig, *, fsdp: bool) -> None:
    """Swap the block linears for torchao's ``Float8Linear``."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if not cfg.compile and not cfg.float8_emulate:
        warnings.warn(
            "parallel.float8 without parallel.compile: the float8 casts run as separate kernels "
            "and a step is slower than bf16; set parallel.compile=true",
            RunWarning,
            stacklevel=2,
        )
    config = dataclasses.replace(
        Float8LinearConfig.from_recipe_name(cfg.float8),
        enable_fsdp_float8_all_gather=float8_all_gather(cfg, fsdp),
        emulate=cfg.float8_emulate,
    )
    if cfg.float8 == "rowwise" and cfg.compile and cfg.activation_checkpointing != "none":
        # As torchtitan: the recomputed forward must round its float8 casts exactly as the
        # first one did, or backward sees other activations than forward made.
        import torch._inductor.config as inductor

        inductor.emulate_precision_casts = True
    convert_to_float8_training(model, module_filter_fn=float8_filter(cfg), config=config)


def keep_scales_current(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """With float8 all-gather: each step's new weights get their scales from one all-reduce
    over every layer, instead of one per layer inside the next forward's all-gathers.

    FSDP casts with the stored scale until the next recompute, so any other change of the
    weights needs one too; returned for the caller to run after loading a checkpoint (reading the
    optimizer's state for the load runs a zero step, which stores the initial weights' scales).
    """
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    def refresh() -> None:
        precompute_float8_dynamic_scale_for_fsdp(model)

    optimizer.register_step_post_hook(lambda *_: refresh())
    return refresh
