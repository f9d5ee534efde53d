from __future__ import annotations

import pytest
import torch

from trainer_core.config import ModelConfig, OptimConfig, ScheduleConfig, TrainModuleConfig
from trainer_core.model import Transformer
from trainer_core.optim import build_optimizer, parameter_groups
from trainer_core.schedule import build_scheduler
from trainer_core.train_module import TrainModule

SEQ = 16


def make_module(micro_seqs: int, **cfg_kwargs) -> TrainModule:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(size="1M", n_layers=2), SEQ)
    opt = build_optimizer(model, OptimConfig(lr=1e-3), torch.device("cpu"))
    sched = build_scheduler(opt, ScheduleConfig(kind="constant", warmup=0), 10)
    cfg = TrainModuleConfig(rank_microbatch_seqs=micro_seqs, **cfg_kwargs)
    return TrainModule(model, opt, sched, cfg, seq_len=SEQ, device=torch.device("cpu"))


def batch_with_padding() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, 300, (8, SEQ + 1), generator=g)
    batch[1, 5:] = -100  # sequences with ignored labels weigh less
    batch[6, 12:] = -100
    return batch


def grads(module: TrainModule) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.model.named_parameters()}


def test_micro_batching_gives_the_same_gradients():
    batch = batch_with_padding()
    whole = make_module(0)
    stats_whole = whole.train_batch(batch.clone())
    split = make_module(2)  # 4 micro-batches of 2 sequences
    stats_split = split.train_batch(batch.clone())
    assert len(split.micro_batches(8)) == 4
    for name, g in grads(whole).items():
        torch.testing.assert_close(grads(split)[name], g, atol=1e-6, rtol=0)
    assert stats_whole.num_tokens.item() == stats_split.num_tokens.item() == 8 * SEQ - 12 - 5
    torch.testing.assert_close(stats_split.ce_sum, stats_whole.ce_sum, atol=1e-4, rtol=1e-6)


def test_bad_microbatch_is_a_clear_error():
    module = make_module(3)
    with pytest.raises(ValueError, match="must divide the per-rank batch of 8 sequences"):
        module.train_batch(torch.randint(0, 300, (8, SEQ + 1)))


def test_clipping_reports_pre_clip_norm_and_clips():
    module = make_module(0, max_grad_norm=1e-3)
    module.train_batch(torch.randint(0, 300, (4, SEQ + 1)))
    norm = module.optim_step()
    assert norm.item() > 1e-3
    # after clipping, the gradient actually used had norm max_grad_norm
    total = torch.sqrt(sum(p.grad.pow(2).sum() for p in module.model.parameters()))
    assert total.item() == pytest.approx(1e-3, rel=1e-3)


def test_z_loss_adds_to_the_objective():
    batch = torch.randint(0, 300, (4, SEQ + 1))
    plain = make_module(0).train_batch(batch)
    with_z = make_module(0, z_loss_multiplier=1e-4).train_batch(batch)
    assert plain.z_sum.item() == 0
    assert with_z.z_sum.item() > 0
    torch.testing.assert_close(plain.ce_sum, with_z.ce_sum)


def test_bf16_autocast_runs_on_cpu():
    module = make_module(0, autocast_precision="bf16")
    stats = module.train_batch(torch.randint(0, 300, (2, SEQ + 1)))
    assert torch.isfinite(stats.ce_sum)


def test_state_dict_round_trip_with_and_without_optimizer():
    a = make_module(0)
    a.train_batch(torch.randint(0, 300, (2, SEQ + 1)))
    a.optim_step()
    state = a.state_dict()
    assert {"model", "optim", "scheduler"} <= state.keys()
    assert set(a.state_dict(optim=False)) == {"model"}
    b = make_module(0)
    b.load_state_dict(state)
    for (n, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=n)
    assert b.scheduler.last_epoch == a.scheduler.last_epoch == 1


def test_no_weight_decay_on_norms_and_embeddings():
    model = Transformer(ModelConfig(size="1M", n_layers=1), SEQ)
    groups = parameter_groups(model, OptimConfig(weight_decay=0.1))
    decayed = {id(p) for p in groups[0]["params"]}
    assert id(model.embed.weight) not in decayed
    assert id(model.norm.weight) not in decayed
    assert id(model.head.weight) in decayed
    assert groups[1]["weight_decay"] == 0.0
    groups = parameter_groups(
        model, OptimConfig(decay_embeddings=True, decay_norms_and_biases=True)
    )
    assert len(groups) == 1


def test_flops_per_token_from_module():
    module = make_module(0)
    assert module.num_flops_per_token() > 6 * 800_000 // 2
