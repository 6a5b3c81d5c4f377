"""hash-topk-scaling — HashTopK applies `routed_scaling_factor` to its top-k weights.

Speeds up: lets the hash-routed MoE layers (layers 0–2) run on expert methods that fuse the
routed scaling into top-k (`should_fuse_routed_scaling_factor_in_topk`, true for
`ModelOptNvFp4FusedMoEMethod`). Stock SGLang ≤ 0.5.13 asserts "not implemented" in
`HashTopK.__init__`, so an NVFP4 checkpoint cannot even build its hash layers without it.

Numerical risk (tier 1): the factor must be applied exactly once per MoE layer. Applied in
top-k *and* in the runner (the stock NVFP4 + marlin path multiplies in `moe_sum_reduce` too) the
routed output is too large by rsf (×1.5 on Flash, ×2.5 on Pro); applied nowhere it is too small.
The correct variant moves the multiplication, so it equals stock within fp32 rounding.

How to verify: `dsv4bisect microtest hash-topk-scaling` (where rsf is applied, per MoE layer and
runner choice); the runtime contract check in the plugin receipts (per layer: exactly one of
top-k or runner scales; `topk_weights.sum(-1)` ≈ rsf iff top-k scales).

Upstream site: `sglang.srt.layers.moe.hash_topk.HashTopK` (`__init__` assert, `forward`);
implemented upstream from 0.5.14 on, where the default variant is inert.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsv4bisect.base.versions import LAYOUTS
from dsv4bisect.patchspec.spec import (
    Condition,
    EngineContext,
    Patch,
    Planners,
    SglangDelivery,
    Variant,
    VllmDelivery,
    version_at_least,
    version_at_most,
)
from dsv4bisect.patchspec.swaps import Op, Site, Swap
from dsv4bisect.sglang_hooks import hash_topk
from dsv4bisect.vllm_hooks import routing as vllm_routing
from dsv4bisect.vllm_hooks import targets as vllm_targets

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TopkScales:
    """The embedded swap of a hash layer's routed scaling (`Op.ROUTED_SCALING`): HashTopK
    multiplies its weights by rsf, and the MoE runner multiplies its sum by rsf only when
    `runner_too` (the double-scale fault: both apply it)."""

    rsf: float
    runner_too: bool

    def topk(self, w: torch.Tensor) -> torch.Tensor:
        return w * self.rsf

    def runner(self, routed: torch.Tensor) -> torch.Tensor:
        return routed * self.rsf if self.runner_too else routed


def _in_topk(runner_too: bool) -> Callable[[Site], TopkScales | None]:
    def build(site: Site) -> TopkScales | None:  # the hash-routed layers only
        if not site.args.is_hash_layer(site.layer):
            return None
        return TopkScales(site.args.routed_scaling_factor, runner_too)

    return build


def _nvfp4_on_stock(ctx: EngineContext) -> bool:
    return ctx.kind == "sglang" and ctx.expert_quant == "nvfp4" and version_at_most((0, 5, 13))(ctx)


def _upstream_has_it(ctx: EngineContext) -> bool:
    return ctx.kind == "sglang" and version_at_least((0, 5, 14))(ctx)


PATCH = Patch(
    name="hash-topk-scaling",
    summary="HashTopK multiplies top-k weights by routed_scaling_factor (stock asserts)",
    tier=1,
    touches=("moe.hash_topk", "moe.routed_scaling"),
    reference="routed_scaling_factor moves from the MoE runner's weighted sum into HashTopK's weights",
    sglang=SglangDelivery(
        hooks={
            "0.5.13": (
                "sglang.srt.layers.moe.hash_topk.HashTopK.__init__",
                "sglang.srt.layers.moe.hash_topk.HashTopK.forward",
            ),
            **{layout: ("sglang.srt.layers.moe.hash_topk.HashTopK.forward",)
               for layout in LAYOUTS[1:]},
        }
    ),
    variants=(
        Variant("topk", "HashTopK scales its weights by rsf; the runner does not (applied once)"),
        Variant(
            "double-scale",
            "HashTopK and the runner both apply rsf (stock NVFP4 + marlin bug): routed output × rsf",
            fault=True,
            citation="SGLang 0.5.13/0.5.14 NVFP4 + Marlin (TopK and moe_sum_reduce both scale)",
            showed=("stock upstream path: ModelOptNvFp4FusedMoEMethod fuses rsf into top-k and "
                    "the Marlin runner multiplies by rsf again: routed output ×1.5 on "
                    "DeepSeek-V4-Flash (the embedded checkpoint's rsf is Flash's 1.5)"),
        ),
    ),
    inert_when=(
        Condition(
            "SGLang >= 0.5.14 already applies rsf in HashTopK (the default variant changes nothing)",
            _upstream_has_it,
            variants=("topk",),
        ),
    ),
    required_when=(
        Condition(
            "SGLang <= 0.5.13 cannot build NVFP4 hash-routed MoE layers without it (HashTopK assert)",
            _nvfp4_on_stock,
        ),
    ),
    vllm=VllmDelivery(
        "hook", "fused_topk_bias applies rsf on hash layers; double-scale adds it once more",
        inert=vllm_routing.inert, sites=vllm_targets.per_layout(vllm_targets.routing_sites)),
    doc=__doc__ or "",
    swaps=(Swap(Op.ROUTED_SCALING, _in_topk(False), ("topk",)),
           Swap(Op.ROUTED_SCALING, _in_topk(True), ("double-scale",))),
    planners=Planners(sglang=hash_topk.plan, vllm=vllm_routing.plan),
)
