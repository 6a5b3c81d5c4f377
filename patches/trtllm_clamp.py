"""trtllm-clamp — the DeepSeek-V4 SwiGLU clamp on the flashinfer TRT-LLM NVFP4 MoE path.

Speeds up: nothing by itself; it makes the fast flashinfer TRT-LLM NVFP4 MoE kernel correct for
DeepSeek-V4, whose experts clamp gate to ≤ `swiglu_limit` (10) and up to ±10 before SiLU·up.
Stock SGLang 0.5.13 never sets `gemm1_clamp_limit` for DeepSeek-V4, so that path runs unclamped.

Numerical risk (tier 3): the kernel clamps the GEMM-1 output *before* applying the per-expert
dequantisation alpha, so the limit must be `swiglu_limit / g1_alphas` per expert. A patch that
passes the raw limit clamps at `limit · alpha` — for NVFP4 alphas (products of tiny global
scales) that crushes every routed expert. Inert under `--moe-runner-backend triton` (the seed
deployment's), which never reaches the TRT-LLM branch.

How to verify: `dsv4bisect microtest trtllm-clamp` (share of gate/up activations beyond the limit
per layer, and the error when the alpha is ignored).

Upstream site: `ModelOptNvFp4FusedMoEMethod.process_weights_after_loading`
(`sglang.srt.layers.quantization.modelopt_quant`; upstream 0.5.14 sets
`layer.gemm1_clamp_limit = swiglu_limit / g1_alphas`).
"""

from __future__ import annotations

from collections.abc import Callable

from dsv4bisect.base.versions import LAYOUTS
from dsv4bisect.patchspec.spec import (
    TRTLLM_BACKENDS,
    CallContract,
    Condition,
    Patch,
    Planners,
    SglangDelivery,
    Variant,
    VllmDelivery,
)
from dsv4bisect.patchspec.swaps import Op, Site, Swap
from dsv4bisect.sglang_hooks import quant
from dsv4bisect.sglang_hooks.targets import trtllm_caller

_TARGET = (
    "sglang.srt.layers.quantization.modelopt_quant."
    "ModelOptNvFp4FusedMoEMethod.process_weights_after_loading"
)
# 0.5.13 passes `full(runner_config.gemm1_clamp_limit)` to the flashinfer kernel entries it
# imports at call time; the per-expert division happens around those entries.
_KERNELS = (
    "flashinfer.fused_moe.trtllm_fp4_block_scale_moe",
    "flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe",
)
from dsv4bisect.vllm_hooks import quant as vllm_quant
from dsv4bisect.vllm_hooks import targets as vllm_targets


def _clamp(mode: str) -> Callable[[Site], str | None]:
    """The embedded swap of the NVFP4 routed experts' SwiGLU clamp (`Op.EXPERT_CLAMP`) where
    the MoE runner is flashinfer TRT-LLM: `limit` (swiglu_limit / alpha on the pre-alpha
    output: the limit itself after dequantisation) or `limit*alpha` (the raw limit)."""

    def build(site: Site) -> str | None:
        return mode if site.moe_backend in TRTLLM_BACKENDS else None

    return build


# ... and the keywords its caller passes them, which the kernel-entry hook divides
_KERNEL_CALLS = tuple(
    CallContract(*trtllm_caller(), callee, frozenset({"gemm1_clamp_limit",
                                                      "output1_scale_gate_scalar"}),
                 why="the hook divides gemm1_clamp_limit by the g1 alphas", exact=False)
    for callee in ("trtllm_fp4_block_scale_moe", "trtllm_fp4_block_scale_routed_moe"))

PATCH = Patch(
    name="trtllm-clamp",
    summary="SwiGLU clamp (swiglu_limit / per-expert alpha) on the flashinfer TRT-LLM NVFP4 MoE path",
    tier=3,
    touches=("moe.clamp[trtllm]",),
    reference="routed-expert SwiGLU clamp on NVFP4 layers when the MoE backend is TRT-LLM",
    sglang=SglangDelivery(hooks={"0.5.13": (_TARGET, *_KERNELS),
                                **{layout: (_TARGET,) for layout in LAYOUTS[1:]}},
                          calls={"0.5.13": _KERNEL_CALLS}),
    variants=(
        Variant("alpha", "clamp limit swiglu_limit / g1_alpha per expert (upstream 0.5.14)"),
        Variant(
            "ignore-alpha",
            "raw swiglu_limit on the pre-alpha GEMM output: clamps at limit·alpha",
            fault=True,
        ),
    ),
    inert_when=(
        Condition(
            "the MoE runner backend is not flashinfer TRT-LLM, so the clamp site is never reached",
            lambda ctx: ctx.moe_backend is not None and ctx.moe_backend not in TRTLLM_BACKENDS,
        ),
    ),
    vllm=VllmDelivery(
        "hook", "TrtLlmNvFp4ExpertsBase.process_weights_after_loading folds the clamp",
        inert=vllm_quant.clamp_inert, sites=vllm_targets.per_layout(vllm_targets.clamp_sites)),
    doc=__doc__ or "",
    swaps=(Swap(Op.EXPERT_CLAMP, _clamp("limit"), ("alpha",)),
           Swap(Op.EXPERT_CLAMP, _clamp("limit*alpha"), ("ignore-alpha",))),
    planners=Planners(sglang=quant.clamp_plan, vllm=vllm_quant.clamp_plan),
)
