"""mhc-bf16 — the mHC hyper-connection mixing GEMM in bf16 instead of fp32.

Speeds up: `hc_pre`, the [T, 4·4096] × [24, 16384]ᵀ GEMM that computes the 24 mixing logits of
every hyper-connection site (two per layer, 86 sites on DeepSeek-V4-Flash). In fp32 it is a
K=16384 reduction that dominates small-batch decode on SM120, where SGLang forces the fp32 torch
path (`SGLANG_OPT_USE_TILELANG_MHC_PRE=False`, `SGLANG_OPT_DEEPGEMM_HC_PRENORM=False`).

Numerical risk (tier 1): bf16 operands give the mixes a relative error near 2⁻⁸. The mixes are
scaled by `hc_scale` and pushed through sigmoid (pre/post) and a 20-iteration Sinkhorn (comb), so
the error reaches the stream collapse, the post gates and the doubly-stochastic residual mixing at
every site, and compounds through the residual streams with depth and context.

How to verify: `dsv4bisect microtest mhc-bf16` (relative error of mixes, pre/post/comb and the
collapsed stream per layer against fp32 with the real `hc_fn`); drift probe KL on long transcripts.

Upstream site (SGLang 0.5.13): `sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayer.hc_pre`
(inner `hc_pre_torch_impl`: `F.linear(x.float(), hc_fn) * rsqrt(mean(x²)+eps)`), followed by
`sglang.srt.layers.mhc.hc_split_sinkhorn` (`sglang.kernels.ops.layernorm.mhc` from 0.5.16; from
0.5.23 `hc_pre` sits on `DeepseekV4DecoderLayerBase`). Needs `fused-mhc-post-pre` off: from
0.5.18 SGLang turns the fused post+pre kernel on by default on SM120, and it bypasses `hc_pre`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dsv4bisect.base.versions import LAYOUTS
from dsv4bisect.patchspec.spec import Mask, Patch, Planners, SglangDelivery, Variant, VllmDelivery
from dsv4bisect.patchspec.swaps import Op, Site, Swap
from dsv4bisect.sglang_hooks import mhc
from dsv4bisect.sglang_hooks.targets import fused_guard_target, hc_pre_target, sinkhorn_target
from dsv4bisect.vllm_hooks import mhc as vllm_mhc
from dsv4bisect.vllm_hooks import targets as vllm_targets

if TYPE_CHECKING:
    import torch


def mixes_in(mode: str) -> Callable[[Site], Callable[..., torch.Tensor]]:
    """The embedded swap of an mHC site's mixing GEMM (`Op.MHC_MIXES`, x [T, n·D], fn [M, n·D]
    -> [T, M] fp32) computed with `mode` operands (`kernels.mhc_mixes`: bf16 or tf32), one GEMM,
    at every site and both precisions."""

    def build(site: Site) -> Callable[..., torch.Tensor]:
        from dsv4bisect.kernels.mhc_mixes import mhc_mixes_ref

        eps = site.args.rms_norm_eps
        return lambda x, fn: mhc_mixes_ref(x, fn, eps, mode=mode)

    return build

PATCH = Patch(
    name="mhc-bf16",
    summary="mHC mixing GEMM (hc_pre) with bf16 operands instead of fp32",
    tier=1,
    touches=("mhc.hc_pre", "mhc.sinkhorn-inputs"),
    reference="hc_pre mixes m = (x·fnᵀ)·rsqrt(mean(x²)+eps) with bf16 operands, output rounded to bf16",
    sglang=SglangDelivery(
        hooks={layout: (hc_pre_target(layout),) for layout in LAYOUTS},
        # the hook body calls SGLang's own Sinkhorn; its install check asks the fused guard
        uses={layout: (sinkhorn_target(layout), fused_guard_target(layout)) for layout in LAYOUTS},
    ),
    variants=(Variant("bf16", "bf16 operands, fp32 accumulation, mixes rounded to bf16"),),
    masked_by=(Mask("fused-mhc-post-pre", "SGLang's fused mHC post+pre kernel bypasses hc_pre on "
                    "every layer after the first, so the hook would act at one site of 86"),),
    vllm=VllmDelivery(
        "hook", "mHC pre: DeepseekV4DecoderLayer.hc_pre (0.20.0, 0.22.0 with the fused "
        "post+pre CustomOp) or the TileLang kernels the model imports by name (0.24.0+)",
        sites=vllm_targets.per_layout(vllm_targets.mhc_sites),
        # the post half of a fused post+pre is vLLM's own kernel, called by the hook
        uses=vllm_targets.per_layout(vllm_targets.mhc_uses),
        calls=vllm_targets.per_layout(vllm_targets.mhc_calls),
        any_site="mHC pre (any of the hooked sites)"),
    doc=__doc__ or "",
    swaps=(Swap(Op.MHC_MIXES, mixes_in("bf16")),),
    planners=Planners(sglang=mhc.plan, vllm=vllm_mhc.plan),
)
