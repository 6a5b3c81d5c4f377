"""How each built-in patch reaches vLLM: THE TABLE, one row per patch.

A row says how the patch's "on" reaches a vLLM deployment (`how`: `hook` through the plugin,
`args` on `vllm serve`'s command line, `absent`: vLLM has no such path or dsv4bisect no hook for
it) with the evidence read from the verified releases, when a variant changes nothing there
(`inert`), and for hooks the planner function the plugin calls in every worker
(`planner(variant, layout, recorder) -> Plan`). Planner modules import torch only inside their
functions, so this table imports no torch (the resolver reads it).

MERGE NOTE (coordinator): the patch declaration is being redesigned so that each `PATCH` carries
one hook planner per engine kind. Each row of `VLLM` below is meant to move into its patch's own
file (`patches/<patch>.py`) as the patch's `vllm` field at merge; nothing else in dsv4bisect
enumerates vLLM deliveries (`delivery()` and `planners()` are the only readers).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsv4bisect.patchspec.spec import EngineContext
from dsv4bisect.patchspec.plan import Plan, Recorder
from dsv4bisect.plugin.vllm import hooks_attention, hooks_mhc, hooks_quant, hooks_routing

Planner = Callable[[str, str, Recorder], Plan]
SGLANG_SWITCH = ("an SGLang environment switch; vLLM's counterparts are config settings, "
                 "bisected as settings (`dsv4bisect switches --engine vllm`, "
                 "`bisect --good-config/--bad-config`)")
# nextn-speculation: vLLM's MTP drafting with the checkpoint's one MTP layer
# (SpeculativeConfig.method "mtp", which vLLM maps DeepSeek-V4's MTP to)
SPECULATIVE = {"method": "mtp", "num_speculative_tokens": 1}


@dataclass(frozen=True)
class VllmPatch:
    """How one patch reaches vLLM (see the module docstring)."""

    how: str  # hook | args | absent
    evidence: str
    planner: Planner | None = None
    # variant, deployment -> why "on" changes nothing there (then it is not sent to vLLM)
    inert: Callable[[str, EngineContext], str | None] = lambda variant, ctx: None
    args: tuple[str, ...] = ()
    variants: tuple[str, ...] | None = None  # None: every variant; else the only ones delivered


def _clamp_inert(variant: str, ctx: EngineContext) -> str | None:
    if ctx.vllm_version is not None and ctx.vllm_version[:3] < (0, 22, 0):
        return ("vLLM 0.20.0 passes gemm1_clamp_limit=None to the TRT-LLM NVFP4 kernels (no "
                "SwiGLU clamp to fold): no faithful hook for either variant")
    if variant == "alpha":
        return ("vLLM >= 0.22.0 folds swiglu_limit / g1_alphas into gemm1_clamp_limit itself "
                "(TrtLlmNvFp4ExpertsBase.process_weights_after_loading)")
    return None


def _decode_inert(variant: str, ctx: EngineContext) -> str | None:
    if ctx.gpu_arch == "sm120":
        return ("vLLM decodes DeepSeek-V4 with FlashInfer's sparse MLA on SM12x "
                "(_select_dsv4_attn_cls); the hooked FlashMLA entry runs on SM90 / SM100")
    return None


def _hash_inert(variant: str, ctx: EngineContext) -> str | None:
    if variant == "topk":
        return ("vLLM applies routed_scaling_factor on hash-routed layers itself "
                "(fused_topk_bias with hash_indices_table, every verified release)")
    return None


# ==== THE TABLE: patch name -> its vLLM delivery and planner ===================================
VLLM: dict[str, VllmPatch] = {
    "mhc-bf16": VllmPatch(
        "hook", "mHC pre: DeepseekV4DecoderLayer.hc_pre (0.20.0, 0.22.0 with the fused "
        "post+pre CustomOp) or the TileLang kernels the model imports by name (0.24.0+)",
        hooks_mhc.plan),
    "hash-topk-scaling": VllmPatch(
        "hook", "fused_topk_bias applies rsf on hash layers; double-scale adds it once more",
        hooks_routing.plan, inert=_hash_inert),
    "mma-decode": VllmPatch(
        "hook", "FlashMLA's sparse FP8 decode entry (flash_mla_with_kvcache), imported by "
        "value into the V4 attention module", hooks_attention.plan,
        inert=_decode_inert, variants=hooks_attention.VARIANTS),
    "triton-indexer": VllmPatch(
        "absent", "no vLLM hook: vLLM scores the lightning indexer with DeepGEMM's "
        "fp8(_fp4)_paged_mqa_logits (0.34.0: or its fused MQA top-k); the patch's site is "
        "SGLang's SM120 torch indexer, which vLLM does not have"),
    "nvfp4-dispatch": VllmPatch(
        "hook", "DeepseekV4FP8Config.get_quant_method picks each MoE layer's method",
        hooks_quant.dispatch_plan, variants=("hybrid",)),
    "trtllm-clamp": VllmPatch(
        "hook", "TrtLlmNvFp4ExpertsBase.process_weights_after_loading folds the clamp",
        hooks_quant.clamp_plan, inert=_clamp_inert),
    "fused-mhc-post-pre": VllmPatch("absent", SGLANG_SWITCH),
    "flashinfer-mhc": VllmPatch("absent", SGLANG_SWITCH),
    "tilelang-indexer": VllmPatch("absent", SGLANG_SWITCH),
    "sm120-flashmla-backend": VllmPatch("absent", SGLANG_SWITCH),
    "fused-hash-topk": VllmPatch("absent", SGLANG_SWITCH),
    "fp8-wo-a-gemm": VllmPatch("absent", SGLANG_SWITCH),
    "nextn-speculation": VllmPatch(
        "args", "vllm serve --speculative-config: MTP drafting with the checkpoint's MTP layer "
        "(SpeculativeConfig.method 'mtp')",
        args=("--speculative-config", json.dumps(SPECULATIVE, separators=(",", ":"))),
        variants=("nextn",)),
}
# ===============================================================================================


def delivery(patch: str) -> VllmPatch:
    """The row of `patch` (a patch without one, e.g. a test-only patch, is absent)."""
    return VLLM.get(patch, VllmPatch("absent", "no vLLM delivery declared"))


def planners() -> dict[str, Planner]:
    """patch -> planner, for the plugin."""
    return {name: row.planner for name, row in VLLM.items() if row.planner is not None}


def delivery_of(patch: str, variant: str, ctx: EngineContext) -> tuple[str, bool, str | None]:
    """(how "on" reaches vLLM, whether it is sent to the engine, why it changes nothing)."""
    row = delivery(patch)
    if row.how == "absent":
        return "absent", False, row.evidence
    if row.variants is not None and variant not in row.variants:
        return row.how, False, (f"{patch}:{variant} has no vLLM delivery (a fault the embedded "
                                "engine models, or a variant vLLM cannot express)")
    inert = row.inert(variant, ctx)
    if inert is not None:
        return "upstream" if row.how == "hook" else row.how, False, inert
    if row.how == "args":
        return "args " + " ".join(row.args), True, None
    return "hook", True, None


def describe() -> list[dict[str, Any]]:
    """The table as rows (docs, `patches matrix --engine vllm`)."""
    return [{"patch": name, "how": row.how, "evidence": row.evidence,
             "variants": list(row.variants) if row.variants else None}
            for name, row in VLLM.items()]
