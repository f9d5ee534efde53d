"""A run's model is built on the meta device and drawn where it trains: the same weights as the
model constructed whole, set by the seed alone (sharded runs: tests/unit/parallel/test_wrap.py)."""

from __future__ import annotations

from dataclasses import replace

import torch

from trainer_core.config.sections import ModelConfig, ParallelConfig
from trainer_core.model.counts import count_params
from trainer_core.model.transformer import Transformer, rope_tables
from trainer_core.parallel.materialize import build_model

CPU = torch.device("cpu")
MODEL = ModelConfig(size="", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=128)


def test_a_meta_built_model_has_the_weights_of_one_constructed_whole():
    torch.manual_seed(123)  # the global RNG plays no part
    built = build_model(MODEL, 16, None, ParallelConfig(), CPU, seed=7)
    torch.manual_seed(0)
    whole = Transformer(MODEL, 16, init_seed=7)
    assert not any(p.is_meta for p in built.parameters())
    # Exact: the same draws from the same generator on the same device.
    for (name, a), b in zip(built.state_dict().items(), whole.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(built.rotations, rope_tables(MODEL.head_dim, 16, MODEL.rope_theta))


def test_tied_embeddings_stay_one_parameter_in_a_meta_built_model():
    """``to_empty`` gave the head a weight of its own: a tied single-device (or TP) run trained
    an untied model, V x d parameters more than its N, the head drawn apart from the embedding."""
    tied = replace(MODEL, tie_embeddings=True)
    for parallel in (ParallelConfig(), ParallelConfig(activation_checkpointing="full")):
        built = build_model(tied, 16, None, parallel, CPU, seed=7)
        assert built.lm_head.w_out.weight is built.embed.weight
        assert sum(p.numel() for p in built.parameters()) == count_params(tied)["total"]
    whole = Transformer(tied, 16, init_seed=7)
    assert torch.equal(
        build_model(tied, 16, None, ParallelConfig(), CPU, 7).embed.weight, whole.embed.weight
    )


def test_the_seed_sets_the_weights_and_the_init_rule_holds():
    a = Transformer(MODEL, 16, init_seed=1)
    b = Transformer(MODEL, 16, init_seed=2)
    assert not torch.equal(a.embed.weight, b.embed.weight)
    std = MODEL.init_std
    wo, w_up = a.blocks["0"].attn.wo.weight, a.blocks["0"].mlp.w_up.weight
    assert abs(w_up.std().item() / std - 0.986) < 0.05  # a normal truncated at 3 std
    assert abs(wo.std().item() / (std / (2 * MODEL.n_layers) ** 0.5) - 0.986) < 0.05
    assert w_up.abs().max().item() <= 3 * std
    assert torch.equal(a.lm_head.norm.weight, torch.ones(MODEL.d_model))
