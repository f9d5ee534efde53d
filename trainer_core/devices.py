"""Peak FLOP/s per device, the denominator of MFU.

GPUs: the vendor's dense bf16 tensor-core figure (what MFU papers use). CPUs have no such
datasheet number, so we measure the float32 matmul throughput this process can reach once and
use that: MFU on CPU then reads "fraction of achievable matmul speed". torch is imported only
by the functions that measure or query a device, so the tables serve the analysis (no torch).
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING

from trainer_core.config.decode import ConfigError
from trainer_core.errors import RunWarning

if TYPE_CHECKING:
    import torch

PEAK_BF16_FLOPS = {
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,
    "H200 NVL": 835e12,
    "H200": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "A10G": 70e12,
    "L4": 121e12,
}
"""Dense (no 2:4 sparsity) bf16 tensor-core FLOP/s per device, the one table for MFU and for
the ladder's device-hours. From NVIDIA's datasheets, halving their with-sparsity figures: H100
SXM 1979 -> 989, PCIe 1513 -> 756, NVL 1671 -> 835; H200 and GH200 as H100 SXM (same compute),
H200 NVL as H100 NVL; B200 4.5 P -> 2.25 P; A100 312 dense; L40S 733 -> 362; L40 362 -> 181; L4
242 -> 121. A10G (AWS's A10 variant) has no NVIDIA datasheet: 70 T is the figure AWS's instance
documentation implies; set ``trainer.peak_flops_per_device`` when it matters. Keys match whole
model names, most specific first (:func:`match_device`)."""

UNKNOWN_GPU_FLOPS = 312e12
"""For a GPU missing from the table (an A100-class guess; the name is printed in the warning)."""


def _words(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", name.lower())


def match_device(device_name: str, keys: Iterable[str]) -> str | None:
    """The key whose words appear whole and in order in ``device_name``, the most specific
    (most words) first; None if none does. Whole words, because model names nest as substrings:
    "NVIDIA L40" is not an "L4", "NVIDIA GH200" not an "H200"; "NVIDIA H100 PCIe" is "H100 PCIe"
    before "H100", and the SXM part (CUDA's "NVIDIA H100 80GB HBM3") is "H100"."""
    words = _words(device_name)

    def contained(key: str) -> bool:
        k = _words(key)
        return any(words[i : i + len(k)] == k for i in range(len(words) - len(k) + 1))

    found = [key for key in keys if contained(key)]
    return max(found, key=lambda key: len(_words(key)), default=None)


def device_key(device_name: str) -> str | None:
    """The table's key for a device name or type ("NVIDIA H100 PCIe" -> "H100 PCIe"); None if
    absent. Also the ``device_type`` a ladder on this device plans with."""
    return match_device(device_name, PEAK_BF16_FLOPS)


def device_peak_flops(device_name: str) -> float | None:
    """The table's figure for a device name or type ("H100", "NVIDIA H100 PCIe"); None if absent."""
    key = device_key(device_name)
    return None if key is None else PEAK_BF16_FLOPS[key]


@functools.cache
def measured_cpu_flops(size: int = 512, windows: int = 6, seconds: float = 0.05) -> float:
    """The best of several short timing windows: a neighbour's burst (another trial on the same
    machine) then lowers one window, not the peak, so MFU stays a fraction of the achievable."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = 0.0
    for _ in range(windows):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            a @ b
            n += 1
        best = max(best, 2 * size**3 * n / (time.perf_counter() - start))
    return best


def peak_is_measured(device: torch.device, configured: float | None = None) -> bool:
    """Whether :func:`peak_flops` is a measurement (a CPU matmul's: anything but CUDA, unless
    configured), which a neighbour's load can have lowered, not a table's or the config's."""
    return device.type != "cuda" and not configured


def peak_flops(device: torch.device, configured: float | None = None) -> float:
    if configured:
        return configured
    if peak_is_measured(device):
        return measured_cpu_flops()
    import torch

    name = torch.cuda.get_device_name(device)
    found = device_peak_flops(name)
    if found is None:
        warnings.warn(
            f"no peak FLOP/s known for {name!r}: MFU assumes {UNKNOWN_GPU_FLOPS:.3g}; set "
            "trainer.peak_flops_per_device",
            RunWarning,
            stacklevel=2,
        )
        return UNKNOWN_GPU_FLOPS
    return found


# Accelerator memory (GiB) by model name in the device type (matched as :func:`match_device`
# does); "cpu" is a working-set budget.
DEVICE_MEMORY_GB = {
    "B200": 180,
    "H200": 141,
    "GH200": 96,
    "H100 NVL": 94,
    "H100": 80,
    "A100": 80,
    "L40S": 48,
    "L40": 48,
    "A10G": 24,
    "L4": 24,
    "cpu": 16,
}
CPU_NOMINAL_FLOPS = 1e11
"""A CPU ladder's device-hours use a nominal 2-core figure (its MFU is measured, not looked up)."""


def device_hours(flops: float, peak_flops: float, mfu: float) -> float:
    """Hours of one device for ``flops`` at ``mfu`` of its peak: the one rule the ladder's plan
    and the analysis's target table both price runs with."""
    return flops / (peak_flops * mfu) / 3600


def require_capability(
    setting: str, need: tuple[int, int], gpu_name: str, capability: tuple[int, int], instead: str
) -> None:
    """Refuse, naming the GPU, a ``setting`` that needs compute capability ``need`` on a GPU of
    ``capability``; ``instead``: what to set on this GPU. Pure, so each GPU generation's answer
    is tested without that GPU."""
    if capability < need:
        raise ConfigError(
            f"{setting} needs compute capability {need[0]}.{need[1]}+ and {gpu_name} has "
            f"{capability[0]}.{capability[1]}: {instead}"
        )
