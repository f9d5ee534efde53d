"""Parameter and FLOP counts from the dims alone (no torch), for planning and MFU."""

from __future__ import annotations

from trainer_core.config.sections import ModelConfig


def count_params(cfg: ModelConfig) -> dict[str, int]:
    """Exact parameter counts from the dims (checked against ``model.parameters()`` in tests).

    ``non_embedding`` follows OLMo-core's ladder convention: every parameter except the input
    embedding, so the LM head counts (with tied embeddings the shared matrix is excluded).
    """
    d, hd = cfg.d_model, cfg.head_dim
    attn = d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd + cfg.n_heads * hd * d
    qk_norm = 2 * hd if cfg.qk_norm else 0
    mlp = 3 * d * cfg.mlp_hidden
    block = attn + qk_norm + mlp + 2 * d
    blocks = cfg.n_layers * block
    embedding = cfg.vocab_size * d
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    non_embedding = blocks + d + head
    return {
        "blocks": blocks,
        "embedding": embedding,
        "head": head,
        "non_embedding": non_embedding,
        "total": non_embedding + embedding,
    }


def num_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token: ``6 N + 12 L H Q T`` (PaLM, Chowdhery et al. 2022, appendix B).

    6N counts the forward (2N) and backward (4N) matmuls over the non-embedding parameters N,
    the output projection included even when it shares the embedding's matrix (N then leaves the
    matrix out, but the matmul runs all the same); ``12 L H Q T`` adds the attention score and
    value matmuls (L layers, H heads of dim Q, sequence length T), not halved for the causal
    mask, matching the usual MFU convention.
    """
    counts = count_params(cfg)
    matmul_params = counts["non_embedding"] + (counts["embedding"] if cfg.tie_embeddings else 0)
    return 6 * matmul_params + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len
