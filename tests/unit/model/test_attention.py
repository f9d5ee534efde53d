"""``model.attention_backend``: the named kernel is the one that runs, and one this device (or
precision) cannot run is a one-line error when the run is built. GPU kernels: tests/cuda."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import ModelConfig
from trainer_core.model.attention import (
    attention_backends_run,
    check_attention_backend,
    check_backend_capability,
    grouped_kv,
    sdpa_context,
)
from trainer_core.model.transformer import Transformer
from trainer_core.train.build import build_trainer

SEQ = 32


def backends_of_a_step(model: Transformer) -> set[str]:
    tokens = torch.randint(0, model.cfg.vocab_size, (2, SEQ))
    return attention_backends_run(lambda: model(tokens).logsumexp(-1).mean().backward())


@pytest.mark.parametrize("backend, ran", [("flash", "flash"), ("math", "math"), ("auto", "flash")])
def test_the_named_backend_is_the_one_that_runs(backend, ran):
    """CPU torch has its own flash kernel, which it also picks when left to choose."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(size="1M", n_layers=1, attention_backend=backend), SEQ)
    assert backends_of_a_step(model) == {ran}


def test_backends_give_the_same_attention():
    torch.manual_seed(0)
    flash = Transformer(ModelConfig(size="1M", n_layers=1, attention_backend="flash"), SEQ)
    math = Transformer(ModelConfig(size="1M", n_layers=1, attention_backend="math"), SEQ)
    math.load_state_dict(flash.state_dict())
    tokens = torch.randint(0, 320, (2, SEQ))
    torch.testing.assert_close(flash(tokens), math(tokens), atol=1e-5, rtol=1e-5)


def test_grouped_heads_repeated_for_the_efficient_kernel_give_the_same_attention():
    """The memory-efficient kernel takes no ``enable_gqa`` (torch refuses it: "No available
    kernel"), so a GQA model forcing it gets each key/value head repeated for its query heads,
    in the order ``enable_gqa`` pairs them; on CPU both forms go through the math kernel."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, SEQ, 16), torch.randn(2, 2, SEQ, 16), torch.randn(2, 2, SEQ, 16)
    assert grouped_kv(q, k, v, "flash") == (k, v, True)
    assert grouped_kv(q, q, q, "efficient") == (q, q, False)
    k4, v4, gqa = grouped_kv(q, k, v, "efficient")
    assert (k4.shape, gqa) == ((2, 4, SEQ, 16), False)
    with sdpa_context("math"):
        grouped = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        repeated = F.scaled_dot_product_attention(q, k4, v4, is_causal=True)
    torch.testing.assert_close(repeated, grouped, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["cudnn", "efficient"])
def test_a_gpu_only_backend_on_cpu_is_a_config_error(tmp_path, tiny_config, backend):
    cfg = tiny_config(tmp_path / "run", f"--model.attention_backend={backend}")
    with pytest.raises(ConfigError) as err:
        build_trainer(cfg)
    assert str(err.value) == (
        f"model.attention_backend: {backend!r} needs a CUDA GPU; on CPU use one of auto, flash, math"
    )
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(
    "backend, sixteen_bit, refused",
    [
        ("flash", False, True),
        ("cudnn", False, True),
        ("efficient", False, False),  # takes fp32 too
        ("math", False, False),
        ("auto", False, False),
    ],
)
def test_sixteen_bit_only_gpu_kernels_refuse_fp32(backend, sixteen_bit, refused):
    """Checked from the config alone: no GPU is touched."""
    if not refused:
        check_attention_backend(backend, torch.device("cuda"), sixteen_bit)
        return
    with pytest.raises(
        ConfigError, match=rf"model.attention_backend: '{backend}' takes only 16-bit"
    ):
        check_attention_backend(backend, torch.device("cuda"), sixteen_bit)


@pytest.mark.parametrize(
    "gpu, capability, refused",
    [("Tesla V100", (7, 0), True), ("Tesla T4", (7, 5), True), ("A100", (8, 0), False)],
)
@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_forced_ampere_kernels_refuse_an_older_gpu_by_name(backend, gpu, capability, refused):
    """A V100 or T4 failed at the first forward ("No available kernel"), the model built."""
    if not refused:
        check_backend_capability(backend, gpu, capability)
        return
    with pytest.raises(ConfigError) as e:
        check_backend_capability(backend, gpu, capability)
    assert str(e.value) == (
        f"model.attention_backend: '{backend}' needs compute capability 8.0+ and {gpu} has "
        f"{capability[0]}.{capability[1]}: use 'efficient' or 'auto' on this GPU"
    )


def test_an_unknown_backend_lists_the_choices(tiny_config, tmp_path):
    with pytest.raises(
        ConfigError, match="model.attention_backend: 'fast' is not allowed; use one"
    ):
        tiny_config(tmp_path, "--model.attention_backend=fast")


@pytest.mark.slow
def test_a_forced_backend_compiles(tmp_path, tiny_config):
    """The backend context inside each compiled block traces (no graph break to eager) and the
    compiled run trains like the eager one."""
    from torch._dynamo.utils import counters

    short = (
        "--checkpoint.enabled=false",
        "--trainer.max_steps=5",
        "--model.attention_backend=flash",
    )
    eager = build_trainer(tiny_config(tmp_path / "a", *short)).fit()
    counters.clear()
    compiled = build_trainer(tiny_config(tmp_path / "b", *short, "--parallel.compile=true")).fit()
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    assert compiled["train/loss_last"] == pytest.approx(eager["train/loss_last"], abs=1e-4)
