"""The language-modelling loss as sums, so micro-batches and ranks add up exactly."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lm_loss_sums(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, z_multiplier: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed token cross-entropy and z-loss (``z_multiplier * logsumexp**2``) over valid labels.

    The logits come in as the head made them (bf16 under bf16 compute) and are upcast here:
    compiled with the head (:class:`trainer_core.model.transformer.LMHead`), the upcast fuses
    into the softmax's reductions and the fp32 logits are never written out whole. The z-loss
    mask is a multiply, not boolean indexing (which waits for the device to count the selected
    rows)."""
    flat = logits.float().flatten(0, 1)
    flat_labels = labels.flatten()
    ce_sum = F.cross_entropy(flat, flat_labels, ignore_index=ignore_index, reduction="sum")
    if not z_multiplier:
        return ce_sum, torch.zeros((), device=logits.device)
    valid = (flat_labels != ignore_index).to(flat.dtype)
    return ce_sum, z_multiplier * (flat.logsumexp(-1).square() * valid).sum()
