"""Which ``scaled_dot_product_attention`` kernel runs (``model.attention_backend``).

Left to itself torch picks the first kernel whose constraints the inputs meet and falls back to
the "math" kernel (a plain matmul-softmax-matmul, several times slower and memory-hungry at long
sequences) without a word. Naming a backend forces it through ``sdpa_kernel``; the device is
checked when the run is built, so a backend this machine lacks is a one-line error, and
:func:`attention_backends_run` reads from the profiler which kernels a call really ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from trainer_core.config.loader import ConfigError
from trainer_core.devices import require_capability

SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
"""``model.attention_backend`` -> torch's backend ("auto" is absent: torch chooses)."""

CPU_BACKENDS = ("auto", "flash", "math")
"""What CPU builds of torch implement (flash as a CPU kernel of its own)."""

SIXTEEN_BIT_BACKENDS = ("flash", "cudnn")
"""GPU kernels that take only fp16/bf16 inputs."""

MIN_CAPABILITY = {"flash": (8, 0), "cudnn": (8, 0)}
"""CUDA compute capability the forced GPU kernels need (Ampere on); older GPUs (V100 7.0, T4
7.5) run 'efficient' or 'math'."""

REPEATS_KV_HEADS = ("efficient",)
"""Backends given every key/value head repeated for its query heads: the memory-efficient kernel
takes no grouped-query inputs (``enable_gqa``), so forcing it on a GQA model would fail with
"No available kernel". The others group the heads themselves, without the copies."""

ATEN_OPS = {
    "flash": "aten::_scaled_dot_product_flash_attention",
    "cudnn": "aten::_scaled_dot_product_cudnn_attention",
    "efficient": "aten::_scaled_dot_product_efficient_attention",
    "math": "aten::_scaled_dot_product_attention_math",
}
"""The op each backend dispatches to, as the profiler names it (a prefix: CPU's flash kernel is
``..._flash_attention_for_cpu``)."""


def sdpa_context(backend: str) -> contextlib.AbstractContextManager:
    """Restrict attention to ``backend`` for the calls inside; "auto" changes nothing."""
    if backend == "auto":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPA_BACKENDS[backend]])


def grouped_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(k, v, enable_gqa)`` for ``scaled_dot_product_attention`` on ``[batch, heads, seq,
    dim]`` inputs: as they are where ``backend`` groups heads itself, else each key/value head
    repeated for the query heads that share it (the order ``enable_gqa`` uses)."""
    groups = q.shape[-3] // k.shape[-3]
    if groups == 1:
        return k, v, False
    if backend not in REPEATS_KV_HEADS:
        return k, v, True
    return k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3), False


def check_attention_backend(backend: str, device: torch.device, sixteen_bit: bool) -> None:
    """Fail in one line when ``backend`` cannot run on ``device`` (with 16-bit compute or not)."""
    where = f"model.attention_backend: {backend!r}"
    if device.type == "cpu" and backend not in CPU_BACKENDS:
        raise ConfigError(f"{where} needs a CUDA GPU; on CPU use one of {', '.join(CPU_BACKENDS)}")
    if device.type != "cuda":
        return
    if backend in SIXTEEN_BIT_BACKENDS and not sixteen_bit:
        raise ConfigError(
            f"{where} takes only 16-bit inputs; set parallel.param_dtype=bfloat16, or use "
            "'efficient' or 'auto' for fp32"
        )
    if backend in MIN_CAPABILITY:
        check_backend_capability(
            backend, torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
        )


def check_backend_capability(backend: str, gpu_name: str, capability: tuple[int, int]) -> None:
    """Refuse, naming the GPU, a forced ``backend`` its compute ``capability`` lacks: torch
    said so only at the first forward, as "No available kernel", after the model was built."""
    require_capability(
        f"model.attention_backend: {backend!r}",
        MIN_CAPABILITY[backend],
        gpu_name,
        capability,
        "use 'efficient' or 'auto' on this GPU",
    )


def attention_backends_run(fn: Callable[[], object]) -> set[str]:
    """The backends (keys of :data:`ATEN_OPS`) whose attention op ran during ``fn()``.

    A compiled graph may inline the math kernel into plain matmuls, which no op name shows;
    the fused kernels stay ops of their own.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = {event.name for event in prof.events()}
    return {b for b, op in ATEN_OPS.items() if any(name.startswith(op) for name in names)}
