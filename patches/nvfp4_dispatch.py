"""nvfp4-dispatch — hybrid FP8 + NVFP4 quant-method dispatch, per layer.

Speeds up: lets a hybrid checkpoint (NVFP4 routed experts, FP8 attention / shared experts / MTP,
as `nvidia/DeepSeek-V4-Flash-NVFP4`) load each layer with its own method: routed experts run the
NVFP4 grouped GEMM (W4A4: E2M1 values, an E4M3 scale per 16, an fp32 global scale), the rest FP8.

Numerical risk (tier 3): which layers get NVFP4 decides three things at once: who applies
`routed_scaling_factor` (`should_fuse_routed_scaling_factor_in_topk` is true for
`ModelOptNvFp4FusedMoEMethod`), whether the SwiGLU clamp runs (the `cutlass_moe_fp4` path that
`--moe-runner-backend triton` selects has none), and the FP4 quantisation of expert activations.

How to verify: `dsv4bisect microtest nvfp4-dispatch` (per-layer method map; NVFP4 quantisation
error of the expert weights); the plugin logs per layer the method, runner and `should_fuse…`.

Upstream site: `ModelOptFp4Config.get_quant_method` / `ModelOptMixedPrecisionConfig.get_quant_method`
(`sglang.srt.layers.quantization.modelopt_quant`) and `FusedMoE.__init__`, which derives
`should_fuse_routed_scaling_factor_in_topk` from the chosen method.
"""

from __future__ import annotations

from dsv4bisect.base.versions import LAYOUTS
from dsv4bisect.patchspec.spec import (
    Condition,
    Patch,
    Planners,
    SglangDelivery,
    Variant,
    VllmDelivery,
)
from dsv4bisect.patchspec.swaps import ExpertQuant, Op, Site, Swap
from dsv4bisect.sglang_hooks import quant
from dsv4bisect.vllm_hooks import quant as vllm_quant
from dsv4bisect.vllm_hooks import targets as vllm_targets


def _mapped(site: Site) -> bool:
    return site.nvfp4_layers is None or site.layer in site.nvfp4_layers


def _hybrid(site: Site) -> ExpertQuant | None:
    """Embedded swap (`Op.EXPERT_QUANT`): at `exact`, the mapped layers' routed experts in
    NVFP4, W4A4; at `deployment` they are already (SGLang 0.5.13 dispatches per layer): none."""
    return None if site.deployment else ExpertQuant(_mapped(site), True)


def _weights_only(site: Site) -> ExpertQuant:
    """Embedded swap: the mapped layers' routed experts in NVFP4, activations unquantised."""
    return ExpertQuant(_mapped(site), False)


_QUANT = "sglang.srt.layers.quantization.modelopt_quant"
_HOOKS = (
    f"{_QUANT}.ModelOptFp4Config.get_quant_method",
    f"{_QUANT}.ModelOptMixedPrecisionConfig.get_quant_method",
    "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.__init__",
)

PATCH = Patch(
    name="nvfp4-dispatch",
    summary="hybrid FP8 + NVFP4 quant-method dispatch per layer (NVFP4 routed experts)",
    tier=3,
    touches=("moe.experts.quant", "moe.routed_scaling", "moe.clamp"),
    reference=("precision deployment: inert (experts are NVFP4 as stored, dispatched per layer as "
               "SGLang 0.5.13 does; weights-only: W4A16 activation path); precision exact: routed "
               "experts fake-quantised to NVFP4 (weights and activations) on the mapped layers"),
    sglang=SglangDelivery(hooks={layout: _HOOKS for layout in LAYOUTS}),
    variants=(
        Variant("hybrid", "NVFP4 W4A4 routed experts on every MoE layer; everything else as stored"),
        Variant("weights-only", "NVFP4 expert weights, unquantised activations (W4A16)"),
    ),
    inert_when=(
        Condition(
            "SGLang 0.5.13+ already dispatches FP8/NVFP4 per layer; the hook only records the "
            "per-layer map (bring your own dispatch change as a custom source patch)",
            lambda ctx: ctx.kind == "sglang",
        ),
    ),
    load_time=("the quant method of each layer is chosen when the layers are built and the "
               "NVFP4 expert weights are derived after loading"),
    vllm=VllmDelivery(
        "hook", "DeepseekV4FP8Config.get_quant_method picks each MoE layer's method",
        variants=("hybrid",), sites=vllm_targets.per_layout(vllm_targets.dispatch_sites)),
    doc=__doc__ or "",
    swaps=(Swap(Op.EXPERT_QUANT, _hybrid, ("hybrid",)),
           Swap(Op.EXPERT_QUANT, _weights_only, ("weights-only",))),
    planners=Planners(sglang=quant.dispatch_plan, vllm=vllm_quant.dispatch_plan),
)
