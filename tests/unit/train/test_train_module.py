from __future__ import annotations

import pytest
import torch

from trainer_core.config.sections import ModelConfig, OptimConfig, ScheduleConfig, TrainModuleConfig
from trainer_core.model.transformer import Transformer
from trainer_core.train.optim import build_optimizer, parameter_groups
from trainer_core.train.schedule import build_scheduler
from trainer_core.train.train_module import TrainModule

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


def test_uneven_micro_batches_still_give_the_exact_gradient():
    """The loss is a sum over global tokens, so a short last micro-batch weighs right."""
    batch = batch_with_padding()
    whole = make_module(0)
    whole.train_batch(batch.clone())
    uneven = make_module(3)
    assert uneven.micro_batches(8) == [(0, 3), (3, 6), (6, 8)]
    uneven.train_batch(batch.clone())
    for name, g in grads(whole).items():
        torch.testing.assert_close(grads(uneven)[name], g, atol=1e-6, rtol=0)


def test_eval_forwards_never_exceed_the_micro_batch():
    batch = batch_with_padding()
    whole = make_module(0).eval_batch(batch)
    split = make_module(3)
    sizes = []
    split.model.register_forward_pre_hook(lambda _, args: sizes.append(args[0].shape[0]))
    ce, count = split.eval_batch(batch)
    assert sizes == [3, 3, 2]
    torch.testing.assert_close(ce, whole[0], atol=0, rtol=1e-5)
    assert count.item() == whole[1].item() == 8 * SEQ - 12 - 5


def test_clipping_reports_pre_clip_norm_and_clips():
    module = make_module(0, max_grad_norm=1e-3)
    module.train_batch(torch.randint(0, 300, (4, SEQ + 1)))
    norm = module.optim_step()
    assert norm.item() > 1e-3
    # after clipping, the gradient actually used had norm max_grad_norm
    total = torch.sqrt(sum(p.grad.pow(2).sum() for p in module.model.parameters()))
    assert total.item() == pytest.approx(1e-3, rel=1e-3)


def test_z_loss_by_hand_masked_in_the_gradient_and_out_of_eval():
    batch = batch_with_padding()
    plain, with_z = make_module(0), make_module(2, z_loss_multiplier=1e-4)
    inputs, labels = batch[:, :-1].clamp(min=0), batch[:, 1:]
    with torch.no_grad():
        logits = with_z.model(inputs).float()
    valid = labels != -100
    by_hand = 1e-4 * (logits.logsumexp(-1)[valid] ** 2).sum()
    stats = with_z.train_batch(batch.clone())
    torch.testing.assert_close(stats.z_sum, by_hand, atol=1e-5, rtol=1e-5)
    plain_stats = plain.train_batch(batch.clone())
    assert plain_stats.z_sum.item() == 0
    # the same ~640 nats summed over other micro-batches: fp32 sums differ in the last bits
    torch.testing.assert_close(plain_stats.ce_sum, stats.ce_sum, atol=0, rtol=1e-5)
    # it reaches the gradient: the difference is the z-loss term's own gradient. A multiplier
    # of 0.1 puts the term (max ~2.5e-3) far above the fp32 rounding of subtracting two whole
    # gradients of ~0.05 (measured 3e-8)
    strong = make_module(2, z_loss_multiplier=1e-1)
    strong.train_batch(batch.clone())
    term = make_module(0)
    z = 1e-1 * (term.model(inputs).float().logsumexp(-1)[valid] ** 2).sum()
    (z / valid.sum()).backward()
    diff = grads(strong)["lm_head.w_out.weight"] - grads(plain)["lm_head.w_out.weight"]
    assert term.model.lm_head.w_out.weight.grad.abs().max().item() > 1e-3
    torch.testing.assert_close(diff, term.model.lm_head.w_out.weight.grad, atol=1e-5, rtol=1e-3)
    # and stays out of the eval loss
    torch.testing.assert_close(with_z.eval_batch(batch)[0], plain.eval_batch(batch)[0])


def test_bf16_autocast_computes_the_blocks_in_bf16_on_cpu():
    """The setting reaches the forward: a block's matmul yields bf16 (fp32 without it), and the
    loss moves off the fp32 one by bf16 rounding, far less than a real change would."""
    batch = batch_with_padding()
    losses, dtypes = {}, {}
    for precision in ("bf16", None):
        module = make_module(0, autocast_precision=precision)
        seen = dtypes[precision] = []
        linear = module.model.blocks["0"].mlp.w_up
        linear.register_forward_hook(lambda _, args, out, seen=seen: seen.append(out.dtype))
        stats = module.train_batch(batch.clone())
        losses[precision] = (stats.ce_sum / stats.num_tokens).item()
    assert dtypes == {"bf16": [torch.bfloat16], None: [torch.float32]}
    assert losses["bf16"] == pytest.approx(losses[None], rel=1e-2)
    # measured 2.8e-5 apart; the same fp32 computation twice is bit-identical
    assert abs(losses["bf16"] - losses[None]) > 1e-6 * losses[None]


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
    assert id(model.lm_head.norm.weight) not in decayed
    assert id(model.lm_head.w_out.weight) in decayed
    assert groups[1]["weight_decay"] == 0.0
    groups = parameter_groups(
        model, OptimConfig(decay_embeddings=True, decay_norms_and_biases=True)
    )
    assert len(groups) == 1
