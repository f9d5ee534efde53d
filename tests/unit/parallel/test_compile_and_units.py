"""How the model is compiled and sharded (issue 25, fixes 3, 5 and 6), on CPU.

Compile: the LM head's matmul and the loss are one graph; 16 blocks share one compiled graph
(a failure to share would hit dynamo's recompile limit and leave later blocks eager, unseen with
the 2-block test models), and a graph break is an error. FSDP2, on 1 and 2 gloo ranks: inputs
are not cast (the fp32 RoPE table reaches every block as fp32), and the LM head (final norm and
output projection) is one unit that stays gathered after forward.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from ranks import join_as_rank
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

from trainer_core.config.sections import ModelConfig, ParallelConfig
from trainer_core.model.transformer import Transformer
from trainer_core.parallel.mesh import MESH_DIMS, mesh_shape
from trainer_core.parallel.wrap import apply_compile, apply_fsdp

SMALL = {"size": "", "d_model": 64, "n_heads": 4, "mlp_hidden": 128, "vocab_size": 64}


@pytest.fixture
def compile_with(monkeypatch) -> Iterator[Callable[[str], CompileCounterWithBackend]]:
    """``compile_with(backend)``: ``torch.compile`` on dynamo's ``backend`` ("eager" runs the
    traced graphs as traced, "inductor" compiles them as a run does), keeping every graph dynamo
    hands it in the returned counter's ``graphs``."""

    def use(backend: str) -> CompileCounterWithBackend:
        counter = CompileCounterWithBackend(backend)
        monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counter))
        return counter

    torch._dynamo.reset()
    yield use
    torch._dynamo.reset()


@pytest.mark.slow
def test_sixteen_blocks_share_one_compiled_graph(compile_with):
    graphs = compile_with("eager").graphs
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**SMALL, n_layers=16), 16)
    apply_compile(model)
    tokens = torch.randint(0, 64, (2, 16))
    model(tokens).float().logsumexp(-1).mean().backward()
    model(tokens).float().logsumexp(-1).mean().backward()  # a second step compiles nothing
    assert len(graphs) == 2  # one graph for all 16 blocks, one for the LM head
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.slow
def test_the_lm_head_and_its_loss_compile_into_one_graph(compile_with):
    """Issue 25, fix 3: the head's matmul and the cross-entropy are in the same compiled graph
    (bf16 logits upcast inside it), and inductor's code for it gives eager's loss and gradients.

    Inductor keeps a fused kernel's bf16 intermediates in fp32 (up to 1.6e-2 off eager's here);
    emulating eager's casts leaves only fp32 round-off (below 1e-6). The gradient is compared
    by the norm of its difference: fp32 sums taken in another order on another CPU can flip one
    element's bf16 rounding (4e-3 on that element), while code that computes otherwise moves
    the whole matrix (without the emulation: 48% of the elements, a relative norm of 3e-3)."""
    import torch._inductor.config as inductor

    graphs = compile_with("inductor").graphs
    torch.manual_seed(0)
    eager = Transformer(ModelConfig(**SMALL, n_layers=2), 16)
    compiled = Transformer(ModelConfig(**SMALL, n_layers=2), 16)
    compiled.load_state_dict(eager.state_dict())
    apply_compile(compiled)
    tokens, labels = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    labels[0, :5] = -100
    results = []
    with inductor.patch(emulate_precision_casts=True):  # backward compiles at its first call
        for model in (eager, compiled):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                ce, z = model(tokens, labels, z_multiplier=1e-2)
            (ce + z).backward()
            results.append((ce.detach(), z.detach(), model.lm_head.w_out.weight.grad))
    ops = [
        {str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")}
        for gm in graphs
    ]
    head_graphs = [g for g in ops if any("cross_entropy" in op for op in g)]
    assert len(graphs) == 2 and len(head_graphs) == 1  # one block graph, one head graph
    assert any("linear" in op for op in head_graphs[0]) and "float" in head_graphs[0]
    (ce, z, grad), (ce_eager, z_eager, grad_eager) = results
    torch.testing.assert_close((ce, z), (ce_eager, z_eager), rtol=1e-4, atol=1e-5)
    assert torch.linalg.norm(grad - grad_eager) < 1e-4 * torch.linalg.norm(grad_eager)


class Breaks(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x


def test_a_graph_break_in_a_block_is_an_error_not_eager(compile_with):
    compile_with("eager")
    model = Transformer(ModelConfig(**SMALL, n_layers=1), 16)
    model.blocks["0"].mlp = Breaks()
    apply_compile(model)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        model(torch.randint(0, 64, (2, 16)))


def _units_worker(rank: int, world: int, port: int, out: str) -> None:
    """FSDP2 over ``world`` gloo ranks in bf16; records what a block's forward got and which
    modules are still gathered after a forward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    join_as_rank(rank, world, port)
    torch.distributed.init_process_group("gloo")
    try:
        torch.manual_seed(0)
        cfg = ParallelConfig(param_dtype="bfloat16")
        model = Transformer(ModelConfig(**SMALL, n_layers=2), 16)
        mesh = init_device_mesh("cpu", mesh_shape(cfg, world), mesh_dim_names=MESH_DIMS)
        apply_fsdp(model, mesh, cfg)
        seen = {}
        model.blocks["1"].register_forward_pre_hook(
            lambda m, args: seen.update(x=str(args[0].dtype), rope=str(args[1].dtype))
        )
        model(torch.randint(0, 64, (2, 16))).float().mean().backward()
        model(torch.randint(0, 64, (2, 16)))  # forward only: who stays gathered?
        gathered = sorted(
            name
            for name, p in model.named_parameters()
            if not isinstance(p, DTensor)  # FSDP2 swaps in the gathered plain tensor
        )
        head = model.lm_head
        group = head._get_fsdp_state()._fsdp_param_group if isinstance(head, FSDPModule) else None
        unit = {
            "head_unit": sorted(
                p._module_info.param_name for p in (group.fsdp_params if group else [])
            ),
            "head_reshards_after_forward": group and group.post_forward_mesh_info is not None,
        }
        if rank == 0:
            Path(out).write_text(json.dumps({**seen, **unit, "gathered": gathered}))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_fsdp2_units_as_torchtitan_sets_them(spawn_ranks, tmp_path, world):
    out = tmp_path / "seen.json"
    spawn_ranks(_units_worker, world, str(out), timeout=240)
    seen = json.loads(out.read_text())
    assert (seen["x"], seen["rope"]) == ("torch.bfloat16", "torch.float32")
    assert seen["head_unit"] == ["weight", "weight"]  # the final norm's and w_out's
    assert seen["head_reshards_after_forward"] is False
    # the root (embedding) stays gathered too
    assert seen["gathered"] == ["embed.weight", "lm_head.norm.weight", "lm_head.w_out.weight"]
