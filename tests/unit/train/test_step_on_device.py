"""A training step that never waits for the device (issue 25, fixes 2 and 3).

A host sync is an op whose result the host must read: ``aten._local_scalar_dense`` (``.item()``,
``float(t)``, ``if t:``, ``.tolist()``) and the data-dependent shapes of ``nonzero`` and boolean
indexing; or a tensor made from host data (``lift_fresh``: ``torch.tensor(...)``, a list index),
which on CUDA is a blocking copy. On CPU they cost nothing, so they are counted at the dispatcher
instead of timed: a run of 12 steps makes exactly as many as one of 6 when both log, evaluate and
save only at their last step, so the steps between make none. The training batches are read
before the count: each is made from host data (the shards), and goes to the device without
blocking.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from trainer_core.config.sections import ModelConfig
from trainer_core.model.loss import lm_loss_sums
from trainer_core.model.transformer import Transformer
from trainer_core.parallel.wrap import clip_grad_norm
from trainer_core.train.build import build_trainer

aten = torch.ops.aten
SYNC_OPS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.lift_fresh.default,
}


class HostSyncs(TorchDispatchMode):
    """Counts the ops that make the host wait for the device, by name."""

    def __init__(self):
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        boolean_index = func is aten.index.Tensor and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
        )
        if func in SYNC_OPS or boolean_index:
            self.seen[str(func)] += 1
        return func(*args, **kwargs)


def syncs_in_a_run(tiny_config, run_dir, steps: int) -> Counter[str]:
    cfg = tiny_config(
        run_dir,
        f"--trainer.max_steps={steps}",
        f"--trainer.log_interval={steps}",
        f"--trainer.eval_interval={steps}",
        "--train_module.z_loss_multiplier=1e-4",
        "--train_module.max_grad_norm=1.0",
        "--optim.fused=true",  # as on CUDA: the foreach AdamW reads its CPU step counters
    )
    trainer = build_trainer(cfg)
    batches = list(itertools.islice(trainer.train_batches(0), steps))
    trainer.train_batches = lambda start: iter(batches[start:])
    with HostSyncs() as syncs:
        trainer.fit()
    return syncs.seen


@pytest.mark.slow
def test_steps_between_log_steps_make_no_host_sync(tmp_path, tiny_config):
    """z-loss on, clipping on: the 6 extra steps add no sync (a step used to make 8 or more)."""
    short = syncs_in_a_run(tiny_config, tmp_path / "short", 6)
    long = syncs_in_a_run(tiny_config, tmp_path / "long", 12)
    assert sum(short.values()) > 0  # the counter sees the log step's reads
    assert long == short, (long, short)


def test_a_fused_optimizer_skips_a_non_finite_update_on_the_device(tmp_path, tiny_config):
    """The skip is decided on the device (AMP's ``found_inf``): the weights stay as they were."""
    trainer = build_trainer(tiny_config(tmp_path / "run", "--optim.fused=true"))
    module = trainer.module
    weight = module.model.embed.weight
    weight.register_hook(lambda grad: grad * float("inf"))
    before = [p.detach().clone() for p in module.model.parameters()]
    module.train_batch(next(trainer.train_batches(0)))
    norm = module.optim_step()
    assert not torch.isfinite(norm)
    for old, new in zip(before, module.model.parameters(), strict=True):
        assert torch.equal(old, new)


def test_clipping_reads_nothing_on_the_host():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(size="1M", n_layers=2), 16)
    model(torch.randint(0, 300, (2, 16))).square().mean().backward()
    before = torch.cat([p.grad.flatten() for p in model.parameters()])
    with HostSyncs() as syncs:
        norm = clip_grad_norm(model, 1e-3)
    after = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert not syncs.seen
    torch.testing.assert_close(norm, before.norm(), rtol=1e-4, atol=0)  # fp32 sum order
    torch.testing.assert_close(after, before * (1e-3 / (norm + 1e-6)), rtol=1e-4, atol=1e-12)


def reference_sums(logits, labels, ignore, z_mult):
    """The loss as it was computed before: fp32 logits, CE, z-loss by boolean indexing."""
    flat, flat_labels = logits.float().flatten(0, 1), labels.flatten()
    ce = F.cross_entropy(flat, flat_labels, ignore_index=ignore, reduction="sum")
    z = z_mult * (flat.logsumexp(-1)[flat_labels != ignore] ** 2).sum()
    return ce, z


@pytest.fixture
def logits_and_labels():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 10, 50, generator=g) * 4
    labels = torch.randint(0, 50, (3, 10), generator=g)
    labels[0, 6:] = -100
    labels[2, :3] = -100
    return logits, labels


def test_the_loss_is_unchanged_and_masks_by_multiplying(logits_and_labels):
    logits, labels = logits_and_labels
    with HostSyncs() as syncs:
        ce, z = lm_loss_sums(logits, labels, -100, 1e-2)
    assert not syncs.seen
    ref_ce, ref_z = reference_sums(logits, labels, -100, 1e-2)
    torch.testing.assert_close(ce, ref_ce, rtol=1e-5, atol=0)
    torch.testing.assert_close(z, ref_z, rtol=1e-5, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_loss_equals_eager_and_upcasts_inside(logits_and_labels, dtype):
    """bf16 logits go in as they are; the fp32 upcast is inside the compiled function, and the
    loss and its gradient match eager's (fp32 to 1e-5)."""
    logits, labels = logits_and_labels
    compiled = torch.compile(lm_loss_sums, fullgraph=True)
    results = []
    for fn in (lm_loss_sums, compiled):
        x = logits.to(dtype).requires_grad_()
        ce, z = fn(x, labels, -100, 1e-2)
        (ce + z).backward()
        assert ce.dtype == torch.float32 and x.grad.dtype == dtype
        results.append((ce.detach(), z.detach(), x.grad.float()))
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    for eager, comp in zip(*results, strict=True):
        torch.testing.assert_close(comp, eager, **tol)
