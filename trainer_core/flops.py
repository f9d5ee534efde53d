"""Peak FLOP/s per device, the denominator of MFU.

GPUs: the vendor's dense bf16 tensor-core figure (what MFU papers use). CPUs have no such
datasheet number, so we measure the float32 matmul throughput this process can reach once and
use that: MFU on CPU then reads "fraction of achievable matmul speed".
"""

from __future__ import annotations

import functools
import time

import torch

# Dense bf16 peak FLOP/s by substring of torch.cuda.get_device_name().
GPU_PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
    "V100": 125e12,
}


@functools.cache
def measured_cpu_flops(size: int = 512, windows: int = 6, seconds: float = 0.05) -> float:
    """The best of several short timing windows: a neighbour's burst (another trial on the same
    machine) then lowers one window, not the peak, so MFU stays a fraction of the achievable."""
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


def peak_flops(device: torch.device, configured: float | None = None) -> float:
    if configured:
        return configured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_PEAK_FLOPS.items():
            if key in name:
                return value
        return 312e12
    return measured_cpu_flops()
