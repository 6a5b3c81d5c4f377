"""mma-decode: split-K decode attention against exact fp32 attention, per context length.

For each context C: `tokens` decode queries at position C − 1 with the layer's real q path, a key
list of the layer's kind with real-weight keys (`keys.py`): HCA, every one of the C // ratio
compressed entries; CSA, min(index_topk, C // 4) entries (which ones does not matter here); then
the sliding window — in that order, as the kernel splits it. The real per-head `attn_sink` takes
part. Exact: `sparse_attention_ref(split=None)`. Patched: 64-key splits with bf16 partials (and
fp32 partials, `split-k-fp32`), LSE merge — the Triton kernel on CUDA, the PyTorch reference
elsewhere. `merge-no-rescale`† is measured only when asked for.
"""

from __future__ import annotations

import torch

from dsv4bisect.kernels.sparse_attention import sparse_attention_ref
from dsv4bisect.microtest import keys
from dsv4bisect.microtest.context import Context, max_abs, rel_err
from dsv4bisect.microtest.results import Row
from dsv4bisect.microtest.tolerances import SPLITK_BF16_REL, SPLITK_FP32_REL
from dsv4bisect.reference.config import ATTN_SPLIT, CSA_RATIO

PATCH = "mma-decode"
# variant -> (label, partial dtype, merge, tolerance)
VARIANTS = {
    "split-k": ("bf16 partials", torch.bfloat16, "lse", SPLITK_BF16_REL),
    "split-k-fp32": ("fp32 partials", torch.float32, "lse", SPLITK_FP32_REL),
    "merge-no-rescale": ("bf16, merge without rescale †", torch.bfloat16, "no-rescale",
                         SPLITK_BF16_REL),
}


def applies(ctx: Context, layer: int) -> bool:
    return True


def needs(ctx: Context, layer: int) -> list[str]:
    p = f"layers.{layer}.attn."
    names = [f"layers.{layer}.attn_norm.weight", p + "attn_sink"]
    names += [p + f"{n}.weight" for n in ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm")]
    if ctx.args.ratio(layer):
        names += [p + "compressor.wkv.weight", p + "compressor.norm.weight"]
    return names


def key_list(ctx: Context, layer: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """pool [N, D] (compressed entries, then the window) and the shared list [N] of rows."""
    a, ratio = ctx.args, ctx.args.ratio(layer)
    window = keys.window_rows(ctx, layer, context, salt=context)
    if ratio == 0:
        comp = window.new_empty(0, a.head_dim)
    else:
        total = context // ratio
        ids = keys.spread(min(a.index_topk, total) if ratio == CSA_RATIO else total, total)
        comp = keys.entries(ctx, layer, f"layers.{layer}.attn.compressor.", a.head_dim, ratio,
                            ids, salt=context)
    pool = torch.cat((comp, window))
    return pool, torch.arange(pool.shape[0], device=pool.device)


def attention(ctx: Context, q: torch.Tensor, pool: torch.Tensor, idx: torch.Tensor,
              sink: torch.Tensor, split: int | None, dtype: torch.dtype,
              merge: str) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5
    if ctx.cuda and split is not None:
        from dsv4bisect.kernels.sparse_attention import sparse_attention

        return sparse_attention(q, pool, idx, sink, scale, split=split, partial_dtype=dtype,
                                merge=merge)
    return sparse_attention_ref(q, pool, idx, sink, scale, split=split, partial_dtype=dtype,
                                merge=merge)


def run(ctx: Context, layer: int) -> list[Row]:
    sink = ctx.weights.get(f"layers.{layer}.attn.attn_sink")
    selected = ctx.variant(PATCH) or "split-k"
    shown = [v for v in VARIANTS if v != "merge-no-rescale" or selected == v]
    x = keys.attn_input(ctx, layer, ctx.spec.tokens, salt="queries")
    qr = keys.query_lora(ctx, layer, x)
    source = "captured" if ctx.acts.has(layer, "attn") else "synthetic"
    rows: list[Row] = []
    for context in ctx.spec.contexts:
        q = keys.queries(ctx, layer, qr, context - 1)  # [T, H, D]
        pool, lst = key_list(ctx, layer, context)
        idx = lst[None, :].expand(q.shape[0], -1).to(torch.int32).contiguous()
        exact = attention(ctx, q, pool, idx, sink, None, torch.float32, "lse")
        n_keys = int(lst.numel())
        splits = -(-n_keys // ATTN_SPLIT)
        for variant in shown:
            label, dtype, merge, tol = VARIANTS[variant]
            got = attention(ctx, q, pool, idx, sink, ATTN_SPLIT, dtype, merge)
            err = max_abs(got, exact)
            rows.append(Row(PATCH, (layer,), f"ctx {context}: {label}", "rel_err",
                            rel_err(got, exact), tol, counted=ctx.counted(PATCH, variant),
                            note=f"{n_keys} keys, {splits} splits",
                            detail={"context": context, "keys": n_keys, "splits": splits,
                                    "variant": variant, "max_abs": err,
                                    "activations": source}))
    return rows
