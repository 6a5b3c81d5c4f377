"""Real-weight queries and keys of one attention layer at a given context length, for the
mma-decode and triton-indexer checks (no full forward: a 128k context is never run).

Every key row of DeepSeek-V4 ends in an RMSNorm with a real weight, so keys are built through
the layer's real projections and norms from synthetic (or captured) inputs:
- window rows: `kv_norm(wkv x)` with RoPE at their positions (the last `sliding_window` tokens);
- a compressed entry pools a window of inputs with a softmax gate; pooling i.i.d. inputs gives a
  vector of the same distribution up to scale, which the entry's RMSNorm removes, so an entry is
  `compressor.norm(wkv x̄)` of one input x̄ (ratio 4, overlapping: `wkv_a x̄a + wkv_b x̄b`, the
  two halves of the projection from two inputs), with RoPE at its window's first position;
- queries: `q = RMSNorm_head(wq_b q_norm(wq_a x))` with RoPE at position context − 1 (decode).
"""

from __future__ import annotations

import torch

from dsv4bisect.microtest.context import Context
from dsv4bisect.reference.config import CSA_RATIO
from dsv4bisect.reference.model import Rope, apply_rope

BLOCK_ROWS = 4096  # inputs projected per block (a 128k-context indexer builds 32768 entries)


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def rope_for(ctx: Context, layer: int) -> Rope:
    a = ctx.args
    if a.ratio(layer):
        return Rope(a.qk_rope_head_dim, a.compress_rope_theta, a.rope_scaling)
    return Rope(a.qk_rope_head_dim, a.rope_theta, None)


def compress_rope(ctx: Context) -> Rope:
    a = ctx.args
    return Rope(a.qk_rope_head_dim, a.compress_rope_theta, a.rope_scaling)


def rotate(x: torch.Tensor, rope: Rope, positions: torch.Tensor) -> torch.Tensor:
    cos, sin = rope.cos_sin(positions.to(x.device))
    return apply_rope(x, cos, sin)


def attn_input(ctx: Context, layer: int, n: int, salt: object) -> torch.Tensor:
    """[n, hidden] attention inputs (after attn_norm)."""
    norm = ctx.weights.get(f"layers.{layer}.attn_norm.weight")
    x, _ = ctx.acts.sublayer_input(layer, "attn", norm, n, salt=salt)
    return x


def query_lora(ctx: Context, layer: int, x: torch.Tensor) -> torch.Tensor:
    """qr = q_norm(wq_a x): [T, q_lora_rank] (the attention's and the indexer's query input)."""
    p, eps = f"layers.{layer}.attn.", ctx.args.rms_norm_eps
    w = ctx.weights
    return rms(x @ w.get(p + "wq_a.weight").T, w.get(p + "q_norm.weight"), eps)


def queries(ctx: Context, layer: int, qr: torch.Tensor, position: int) -> torch.Tensor:
    """q [T, H, D], per-head unweighted RMSNorm, RoPE at `position`."""
    a = ctx.args
    q = (qr @ ctx.weights.get(f"layers.{layer}.attn.wq_b.weight").T)
    q = rms(q.view(qr.shape[0], a.num_attention_heads, a.head_dim), None, a.rms_norm_eps)
    pos = torch.full((qr.shape[0],), position, dtype=torch.long)
    return rotate(q, rope_for(ctx, layer), pos)


def window_rows(ctx: Context, layer: int, context: int, salt: object) -> torch.Tensor:
    """K=V rows of the sliding window ending at position context − 1: [W, D]."""
    a, p = ctx.args, f"layers.{layer}.attn."
    n = min(a.sliding_window, context)
    x = attn_input(ctx, layer, n, ("window", salt))
    kv = rms(x @ ctx.weights.get(p + "wkv.weight").T, ctx.weights.get(p + "kv_norm.weight"),
             a.rms_norm_eps)
    return rotate(kv, rope_for(ctx, layer), torch.arange(context - n, context))


def entries(ctx: Context, layer: int, prefix: str, head_dim: int, ratio: int,
            ids: torch.Tensor, salt: object) -> torch.Tensor:
    """Compressed entries `ids` of a compressor under `prefix` (e.g. `layers.3.attn.compressor.`):
    [len(ids), head_dim], RoPE at ratio·id. Built in blocks of inputs to bound memory."""
    a, w = ctx.args, ctx.weights
    wkv, norm = w.get(prefix + "wkv.weight"), w.get(prefix + "norm.weight")
    out = []
    for b0 in range(0, ids.numel(), BLOCK_ROWS):
        n = min(BLOCK_ROWS, ids.numel() - b0)
        if ratio == CSA_RATIO:  # overlap: first half from one input, second from another
            x = attn_input(ctx, layer, 2 * n, ("entries", prefix, salt, b0))
            pooled = x[:n] @ wkv[:head_dim].T + x[n:] @ wkv[head_dim:].T
        else:
            x = attn_input(ctx, layer, n, ("entries", prefix, salt, b0))
            pooled = x @ wkv.T
        out.append(rms(pooled, norm, a.rms_norm_eps))
    kv = torch.cat(out) if out else torch.empty(0, head_dim, device=ctx.device)
    return rotate(kv, compress_rope(ctx), ids.cpu() * ratio)


def spread(count: int, total: int) -> torch.Tensor:
    """`count` entry ids spread evenly over 0..total-1 (all of them when count >= total)."""
    if count >= total:
        return torch.arange(total)
    return torch.linspace(0, total - 1, count).round().long().unique()
