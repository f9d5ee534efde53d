"""Device names resolve to their own row of the FLOPs and memory tables, never to a model whose
name is a substring of theirs."""

from __future__ import annotations

import pytest

from trainer_core.config.loader import from_dict
from trainer_core.devices import device_key, device_peak_flops
from trainer_core.ladder.config import LadderConfig


@pytest.mark.parametrize(
    "name, key, tflops, memory_gb",
    [
        ("NVIDIA L4", "L4", 121, 24),
        ("NVIDIA L40", "L40", 181, 48),
        ("NVIDIA L40S", "L40S", 362, 48),
        ("NVIDIA H100 80GB HBM3", "H100", 989, 80),  # what CUDA calls the SXM part
        ("H100 SXM", "H100", 989, 80),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756, 80),
        ("NVIDIA H100 NVL", "H100 NVL", 835, 94),
        ("NVIDIA H200", "H200", 989, 141),
        ("NVIDIA H200 NVL", "H200 NVL", 835, 141),
        ("NVIDIA GH200 480GB", "GH200", 989, 96),
        ("NVIDIA A100-SXM4-80GB", "A100", 312, 80),
        ("NVIDIA A100 80GB PCIe", "A100", 312, 80),
        ("NVIDIA A10G", "A10G", 70, 24),
        ("h100-pcie", "H100 PCIe", 756, 80),
    ],
)
def test_a_device_name_gets_its_own_row(name, key, tflops, memory_gb):
    assert device_key(name) == key
    assert device_peak_flops(name) == tflops * 1e12
    ladder = from_dict(LadderConfig, {"device_type": name, "memory_fraction": 1.0})
    assert ladder.memory_bytes == memory_gb * 2**30


@pytest.mark.parametrize("name", ["Tesla T4", "NVIDIA RTX A1000", "H1000"])
def test_a_name_that_only_contains_a_known_model_is_unknown(name):
    assert device_key(name) is None and device_peak_flops(name) is None
