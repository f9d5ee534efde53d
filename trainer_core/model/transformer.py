"""A decoder-only transformer in the Llama / OLMo-2 family, readable in one sitting.

Pre-norm blocks (RMSNorm -> grouped-query attention with RoPE and optional per-head QK-norm ->
residual; RMSNorm -> SwiGLU MLP -> residual), then the LM head: a final RMSNorm and an untied (or
tied) output projection, which also computes the loss when given labels.
Attention is ``F.scaled_dot_product_attention`` (flash / cuDNN kernels on GPU), restricted to
``model.attention_backend`` when one is named (:mod:`trainer_core.model.attention`).
Module names (``blocks.<i>.attn.wq`` ...) are what ``trainer_core.parallel`` shards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainer_core.config.sections import ModelConfig
from trainer_core.model.attention import grouped_kv, sdpa_context
from trainer_core.model.loss import lm_loss_sums


class _SumGrad(torch.autograd.Function):
    """Identity forward; backward sums the gradient over a process group (Megatron's "f")."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        dist.all_reduce(local, group=ctx.group)
        return grad, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.grad_group = None
        """Set by tensor parallelism on QK-norms, which see only this rank's heads."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32: bf16 squares lose too much precision.
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        weight = (
            self.weight if self.grad_group is None else _SumGrad.apply(self.weight, self.grad_group)
        )
        return out.type_as(x) * weight


def rope_tables(head_dim: int, seq_len: int, theta: float, device=None) -> torch.Tensor:
    """Rotary position embeddings' ``cos`` and ``sin``, ``[seq_len, head_dim / 2, 2]``.

    Real tables, not complex numbers: ``torch.compile`` generates no kernels for complex ops
    and would fall back to eager ones inside every compiled block."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), freqs)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, H, D]`` pairwise, ``(x[2i], x[2i+1])`` by the angle of position and
    ``i`` in ``rotations [T, D/2, 2]``, in fp32."""
    x0, x1 = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    cos, sin = rotations[None, : x.shape[1], None].unbind(-1)
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.backend = cfg.attention_backend
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 instead of the head count: under tensor parallelism each rank holds a slice of heads.
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        v = self.wv(x).view(b, t, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, rotations), apply_rope(k, rotations)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        k, v, gqa = grouped_kv(q, k, v, self.backend)
        with sdpa_context(self.backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.w_down = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rotations)
        return x + self.mlp(self.mlp_norm(x))


class LMHead(nn.Module):
    """Final norm and output projection, and given labels the loss: one module, so that compile
    (``parallel.compile``) makes the head's matmul and the loss one graph, in which the bf16
    logits are upcast inside the fused softmax, and FSDP2 shards it as one unit (as OLMo-core's
    ``LMHead``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.w_out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        labels: torch.Tensor | None = None,
        ignore_index: int = -100,
        z_multiplier: float = 0.0,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        logits = self.w_out(self.norm(x))
        if labels is None:
            return logits
        return lm_loss_sums(logits, labels, ignore_index, z_multiplier)


class Transformer(nn.Module):
    """The model. Built on the meta device (``with torch.device("meta")``) it holds shapes only
    and draws nothing: :func:`trainer_core.parallel.materialize.build_model` wraps it, then gives
    each rank its part of the same initial weights (:meth:`initial_parameters`)."""

    def __init__(self, cfg: ModelConfig, max_seq_len: int = 4096, *, init_seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.max_seq_len = max_seq_len
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # A ModuleDict keyed by layer index keeps names stable under activation checkpointing.
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.lm_head = LMHead(cfg)
        self.tie_weights()
        self.register_buffer(
            "rotations", rope_tables(cfg.head_dim, max_seq_len, cfg.rope_theta), persistent=False
        )
        if not self.rotations.is_meta:
            self.init_weights(init_seed)

    def tie_weights(self) -> None:
        """With ``tie_embeddings``, make the head's weight the embedding's, one parameter. Again
        after ``to_empty``: it allocates each module's parameters anew, which split a tie made
        on the meta device unless FSDP's DTensors (swapped in place) kept it."""
        if self.cfg.tie_embeddings and self.lm_head.w_out.weight is not self.embed.weight:
            self.lm_head.w_out.weight = self.embed.weight

    def initial_parameters(
        self, seed: int, device: torch.device
    ) -> Iterator[tuple[nn.Parameter, torch.Tensor]]:
        """Each parameter with its whole initial value, drawn on ``device`` in parameter order
        from one generator seeded with ``seed``: a model's initial weights depend on the seed and
        the device type, not on the global RNG or how the model is sharded.

        Truncated normal(0, init_std) everywhere, residual outputs scaled by 1/sqrt(2 L) (GPT-2 /
        OLMo style: the two projections writing into the residual stream per block, ``attn.wo``
        and ``mlp.w_down``, get std / sqrt(2 n_layers) so the residual variance stays O(1) with
        depth); norms start at 1. Names may carry wrappers' prefixes (compile, AC): the suffix
        decides.
        """
        generator = torch.Generator(device).manual_seed(seed)
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            value = torch.empty(p.shape, dtype=p.dtype, device=device)
            if p.dim() == 1:
                nn.init.ones_(value)
            else:
                s = out_std if name.endswith(("attn.wo.weight", "mlp.w_down.weight")) else std
                nn.init.trunc_normal_(value, std=s, a=-3 * s, b=3 * s, generator=generator)
            yield p, value

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Write :meth:`initial_parameters` into an unsharded model, where its weights are."""
        for p, value in self.initial_parameters(seed, self.rotations.device):
            p.copy_(value)

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Recompute the RoPE table in place (after ``to_empty`` left it uninitialised)."""
        self.rotations.copy_(
            rope_tables(
                self.cfg.head_dim, self.max_seq_len, self.cfg.rope_theta, self.rotations.device
            )
        )

    def forward(
        self,
        tokens: torch.Tensor,
        labels: torch.Tensor | None = None,
        *,
        ignore_index: int = -100,
        z_multiplier: float = 0.0,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, T, vocab]`` for input ids ``[B, T]``; given ``labels`` (``[B, T]``), the
        summed cross-entropy and z-loss instead (:func:`trainer_core.model.loss.lm_loss_sums`)."""
        x = self.embed(tokens)
        rotations = self.rotations
        for block in self.blocks.values():
            x = block(x, rotations)
        return self.lm_head(x, labels, ignore_index, z_multiplier)
