"""triton-indexer: top-k selection of bf16 indexer scores against fp32, per context length.

CSA layers only. For each context C: `tokens` queries at position C − 1, with the indexer's real
`wq_b`, `weights_proj` and its compressor's real `wkv` and `norm` (keys built as in `keys.py`,
all C // 4 entries visible). Scores `Σ_h w_h · relu(q_h · k)` in fp32 (`indexer_logits_ref`) and
with the per-head dots rounded to bf16 (the patch; the Triton kernel on CUDA); both go through
`indexer_topk(index_topk)`. Reported: the mean share of the fp32 selection that bf16 keeps, and
the share of queries whose selection changes at all.
"""

from __future__ import annotations

import torch

from dsv4bisect.kernels.indexer import indexer_logits_ref, indexer_topk
from dsv4bisect.microtest import keys
from dsv4bisect.microtest.context import Context, rel_err
from dsv4bisect.microtest.results import Row
from dsv4bisect.microtest.tolerances import INDEXER_MIN_OVERLAP
from dsv4bisect.reference.config import CSA_RATIO

PATCH = "triton-indexer"


def applies(ctx: Context, layer: int) -> bool:
    return ctx.args.layer_kind(layer) == "csa"


def needs(ctx: Context, layer: int) -> list[str]:
    p = f"layers.{layer}.attn."
    return [f"layers.{layer}.attn_norm.weight", p + "wq_a.weight", p + "q_norm.weight",
            p + "indexer.wq_b.weight", p + "indexer.weights_proj.weight",
            p + "indexer.compressor.wkv.weight", p + "indexer.compressor.norm.weight"]


def patched_logits(ctx: Context, q: torch.Tensor, w: torch.Tensor, k: torch.Tensor,
                   n_visible: torch.Tensor, mode: str) -> torch.Tensor:
    if ctx.cuda:
        from dsv4bisect.kernels.indexer import indexer_logits

        return indexer_logits(q, w, k, n_visible, mode=mode)
    return indexer_logits_ref(q, w, k, n_visible, mode=mode)


def overlap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Mean share of a's valid picks also in b, and the share of rows that differ. [T, k] each."""
    shares, changed = [], 0
    for ra, rb in zip(a.tolist(), b.tolist(), strict=True):
        sa, sb = {i for i in ra if i >= 0}, {i for i in rb if i >= 0}
        shares.append(len(sa & sb) / len(sa) if sa else 1.0)
        changed += sa != sb
    return sum(shares) / len(shares), changed / len(shares)


def run(ctx: Context, layer: int) -> list[Row]:
    a, w, p = ctx.args, ctx.weights, f"layers.{layer}.attn.indexer."
    mode = ctx.variant(PATCH) or "bf16"
    H, d = a.index_n_heads, a.index_head_dim
    x = keys.attn_input(ctx, layer, ctx.spec.tokens, salt="queries")
    qr = keys.query_lora(ctx, layer, x)
    hw = (x @ w.get(p + "weights_proj.weight").T) * (d**-0.5 * H**-0.5)  # [T, H]
    source = "captured" if ctx.acts.has(layer, "attn") else "synthetic"
    rows: list[Row] = []
    for context in ctx.spec.contexts:
        total = context // CSA_RATIO
        if total == 0:
            continue
        q = (qr @ w.get(p + "wq_b.weight").T).view(-1, H, d)
        pos = torch.full((q.shape[0],), context - 1, dtype=torch.long)
        q = keys.rotate(q, keys.compress_rope(ctx), pos)
        k = keys.entries(ctx, layer, p + "compressor.", d, CSA_RATIO, torch.arange(total),
                         salt=context)
        n_vis = torch.full((q.shape[0],), total, dtype=torch.long, device=q.device)
        ref = indexer_logits_ref(q, hw, k, n_vis, mode="fp32")
        got = patched_logits(ctx, q, hw, k, n_vis, mode)
        share, changed = overlap(indexer_topk(ref, a.index_topk), indexer_topk(got, a.index_topk))
        rows.append(Row(PATCH, (layer,), f"ctx {context}: top-{a.index_topk} overlap ({mode})",
                        "overlap", share, INDEXER_MIN_OVERLAP, bound="min",
                        note=f"{total} entries; {changed:.0%} of queries flip a pick",
                        detail={"context": context, "entries": total, "queries_changed": changed,
                                "score_rel_err": rel_err(got, ref), "mode": mode,
                                "activations": source}))
    return rows
