"""mhc-bf16: the mHC mixing GEMM in bf16 against fp32, at both sites of a layer.

Per site (attn, ffn) with the layer's real `hc_{site}_fn` [24, n·D], `hc_{site}_base` [24] and
`hc_{site}_scale` [3]: mixes `m = (H·fnᵀ)·rsqrt(mean H² + eps)` in fp32 and in bf16 (the patch:
bf16 operands, fp32 accumulation, bf16 product; the Triton kernel on CUDA), then both through the
same fp32 Sinkhorn split (pre [T, n], post [T, n], comb [T, n, n]) and the collapse
`x = Σ_j pre_j·H_j` [T, D]. Each is reported as ‖bf16 − fp32‖ / ‖fp32‖.
"""

from __future__ import annotations

import torch

from dsv4bisect.kernels.mhc_mixes import mhc_mixes_ref
from dsv4bisect.microtest.context import Context, max_abs, rel_err
from dsv4bisect.microtest.results import Row
from dsv4bisect.microtest.tolerances import MHC_REL
from dsv4bisect.reference.model import hc_split_sinkhorn

PATCH = "mhc-bf16"
SITES = ("attn", "ffn")


def applies(ctx: Context, layer: int) -> bool:
    return True


def needs(ctx: Context, layer: int) -> list[str]:
    return [f"layers.{layer}.hc_{site}_{p}" for site in SITES for p in ("fn", "base", "scale")]


def mixes_bf16(x: torch.Tensor, fn: torch.Tensor, eps: float, cuda: bool) -> torch.Tensor:
    """The patched op: the Triton kernel on CUDA, its PyTorch reference elsewhere."""
    if cuda:
        from dsv4bisect.kernels.mhc_mixes import mhc_mixes

        return mhc_mixes(x, fn, eps, mode="bf16")
    return mhc_mixes_ref(x, fn, eps, mode="bf16")


def run(ctx: Context, layer: int) -> list[Row]:
    a, w = ctx.args, ctx.weights
    rows: list[Row] = []
    for site in SITES:
        fn = w.get(f"layers.{layer}.hc_{site}_fn")
        base = w.get(f"layers.{layer}.hc_{site}_base")
        scale = w.get(f"layers.{layer}.hc_{site}_scale")
        h, source = ctx.acts.streams(layer, f"hc_{site}", ctx.spec.tokens)  # [T, n, D]
        x = h.flatten(1)
        ref = mhc_mixes_ref(x, fn, a.rms_norm_eps, mode="fp32")  # [T, 24]
        got = mixes_bf16(x, fn, a.rms_norm_eps, ctx.cuda)
        parts_ref = hc_split_sinkhorn(ref, scale, base, a.hc_mult, a.hc_sinkhorn_iters, a.hc_eps)
        parts_got = hc_split_sinkhorn(got, scale, base, a.hc_mult, a.hc_sinkhorn_iters, a.hc_eps)
        collapse_ref = (parts_ref[0][..., None] * h).sum(1)
        collapse_got = (parts_got[0][..., None] * h).sum(1)
        pairs = [("mixes", got, ref), ("pre", parts_got[0], parts_ref[0]),
                 ("post", parts_got[1], parts_ref[1]), ("comb", parts_got[2], parts_ref[2]),
                 ("collapsed stream", collapse_got, collapse_ref)]
        for what, g, r in pairs:
            err = max_abs(g, r)
            rows.append(Row(PATCH, (layer,), f"{site} site: {what}", "rel_err", rel_err(g, r),
                            MHC_REL, note=f"max abs {err:.2g}",
                            detail={"max_abs": err, "activations": source,
                                    "hc_scale": [float(v) for v in scale.flatten()]}))
    return rows
