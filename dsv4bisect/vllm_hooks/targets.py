"""Every vLLM symbol the plugin hooks or calls, per hook layout, with the signature it expects
and the modules holding copies imported by value.

A layout is named by the first verified release it covers (`base/vllm_releases.LAYOUTS`); each
verified release starts one, because each moved something the mHC hook relies on:

    0.20.0  model_executor/models/deepseek_v4.py: DeepseekV4DecoderLayer.hc_pre
            (-> torch.ops.vllm.mhc_pre)
    0.22.0  models/deepseek_v4/nvidia/model.py: hc_pre (norm fused) + MHCFusedPostPreOp (CustomOp)
    0.24.0  the TileLang mHC kernels called by name (`from ...mhc.tilelang import mhc_pre_tilelang`)
    0.28.0  + mhc_pre_broadcast_tilelang (the first layer's residual broadcast from (T, H))
    0.34.0  + mhc_fused_post_pre_tilelang_reuse_residual

A site (`patchspec.spec.VllmSite`) names the defining object (`module.function` or
`module.Class.method`) and, for a module-level function, the modules that did `from module
import function` and must have that copy rebound too (a rebinding in the defining module alone
would never be called). Each patch declares its own sites, uses and call contracts per layout
in its `VllmDelivery` from the functions here (`per_layout`); the signatures below drive the
install-time check (inspect.signature of the live object, `plugin/vllm/install.py`), the check
of the shipped per-release facts (`plugin/vllm/facts.py`, tests/vllm) and `doctor`. Imports
nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from dsv4bisect.base.vllm_releases import LAYOUTS
from dsv4bisect.patchspec.spec import VllmCall, VllmSite
from dsv4bisect.sglang_hooks.targets import Signature

MHC = "vllm.model_executor.kernels.mhc.tilelang"
MHC_OP = "vllm.model_executor.layers.mhc"
V4_OLD = "vllm.model_executor.models.deepseek_v4"  # 0.20.0: one file
V4 = "vllm.models.deepseek_v4.nvidia.model"  # 0.22.0 on: the NVIDIA model
V4_QUANT = "vllm.models.deepseek_v4.quant_config"
ROUTER = "vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router"
FLASHMLA = "vllm.v1.attention.ops.flashmla"
# ops/flashmla.py re-exports the vendored FlashMLA entry under an `if` (with a raising fallback
# assigned in the `else`): its signature is the vendored function's
FLASHMLA_DEF = "vllm.third_party.flashmla.flash_mla_interface.flash_mla_with_kvcache"
ATTN_OLD = "vllm.model_executor.layers.deepseek_v4_attention"
ATTN = "vllm.models.deepseek_v4.nvidia.flashmla"
TRTLLM = "vllm.model_executor.layers.fused_moe.experts.trtllm_nvfp4_moe"
WORKER = "vllm.v1.worker.worker_base.WorkerWrapperBase.init_worker"
# every engine step runs it eagerly: the receipts' call evidence is flushed after it (a hook
# inside the compiled model can only set a dict entry, plugin/vllm/install.py)
WORKER_STEP = "vllm.v1.worker.gpu_worker.Worker.execute_model"
# ... and after the warm-up (profile run, compilation, CUDA-graph capture), which runs before
# the server answers /health: the evidence is on disk when the launcher reads the receipts
WORKER_WARMUP = "vllm.v1.worker.gpu_worker.Worker.compile_or_warm_up_model"
PLUGINS = "vllm.plugins.load_general_plugins"
T = TypeVar("T")


def model_module(layout: str) -> str:
    return V4_OLD if layout == "0.20.0" else V4


def quant_module(layout: str) -> str:
    return V4_OLD if layout == "0.20.0" else V4_QUANT


def attention_module(layout: str) -> str:
    return ATTN_OLD if layout == "0.20.0" else ATTN


# -- per patch: the sites of each layout -------------------------------------------------------
def mhc_sites(layout: str) -> tuple[VllmSite, ...]:
    if layout == "0.20.0":
        return (VllmSite(f"{V4_OLD}.DeepseekV4DecoderLayer.hc_pre"),)
    if layout == "0.22.0":
        return (VllmSite(f"{V4}.DeepseekV4DecoderLayer.hc_pre"),
                VllmSite(f"{MHC_OP}.MHCFusedPostPreOp.forward_cuda"))
    names = ["mhc_pre_tilelang", "mhc_fused_post_pre_tilelang"]
    if layout >= "0.28.0":
        names.append("mhc_pre_broadcast_tilelang")
    if layout >= "0.34.0":
        names.append("mhc_fused_post_pre_tilelang_reuse_residual")
    return tuple(VllmSite(f"{MHC}.{n}", (V4,)) for n in names)


def routing_sites(layout: str) -> tuple[VllmSite, ...]:
    """double-scale: around the routing function (its module calls it by its global name; the
    model imported it by value) and after the MoE block's construction (its rsf)."""
    model = model_module(layout)
    return (VllmSite(f"{ROUTER}.fused_topk_bias", (model,)), VllmSite(f"{model}.DeepseekV4MoE.__init__"))


def decode_sites(layout: str) -> tuple[VllmSite, ...]:
    return (VllmSite(f"{FLASHMLA}.flash_mla_with_kvcache", (attention_module(layout),)),)


def dispatch_sites(layout: str) -> tuple[VllmSite, ...]:
    return (VllmSite(f"{quant_module(layout)}.DeepseekV4FP8Config.get_quant_method"),)


def clamp_sites(layout: str) -> tuple[VllmSite, ...]:
    if layout == "0.20.0":
        return ()
    return (VllmSite(f"{TRTLLM}.TrtLlmNvFp4ExpertsBase.process_weights_after_loading"),)


def mhc_uses(layout: str) -> tuple[str, ...]:
    """The post half of a fused post+pre: the mHC hook calls vLLM's own (`mhc._post_fn`)."""
    return () if layout == "0.20.0" else (f"{MHC}.mhc_post_tilelang",)


# -- signatures ---------------------------------------------------------------------------------
_PRE = ("residual", "fn", "hc_scale", "hc_base", "rms_eps", "hc_pre_eps", "hc_sinkhorn_eps",
        "hc_post_mult_value", "sinkhorn_repeat", "n_splits", "norm_weight", "norm_eps")
_FUSED = ("x", "residual", "post_layer_mix", "comb_res_mix", "fn", "hc_scale", "hc_base",
          "rms_eps", "hc_pre_eps", "hc_sinkhorn_eps", "hc_post_mult_value", "sinkhorn_repeat",
          "n_splits", "tile_n", "norm_weight", "norm_eps")
_ROUTE = ("hidden_states", "gating_output", "scoring_func", "e_score_correction_bias", "topk",
          "renormalize", "indices_type", "input_tokens", "hash_indices_table",
          "routed_scaling_factor")
_MLA = ("q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata")


def _signatures(layout: str) -> dict[str, Signature]:
    model = model_module(layout)
    out = {
        f"{ROUTER}.fused_topk_bias": Signature(_ROUTE, exact=False),
        f"{model}.DeepseekV4MoE.__init__": Signature(("self", "vllm_config", "prefix"),
                                                     exact=False),
        f"{FLASHMLA}.flash_mla_with_kvcache": Signature(_MLA, exact=False),
        f"{quant_module(layout)}.DeepseekV4FP8Config.get_quant_method": Signature(
            ("self", "layer", "prefix")),
        WORKER: Signature(("self", "all_kwargs")),
        WORKER_STEP: Signature(("self", "scheduler_output"), exact=False),
        WORKER_WARMUP: Signature(("self",), exact=False),
    }
    if layout == "0.20.0":
        out[f"{V4_OLD}.DeepseekV4DecoderLayer.hc_pre"] = Signature(
            ("self", "x", "hc_fn", "hc_scale", "hc_base"))
        return out
    out[f"{TRTLLM}.TrtLlmNvFp4ExpertsBase.process_weights_after_loading"] = Signature(
        ("self", "layer"))
    out[f"{MHC}.mhc_post_tilelang"] = Signature(("x", "residual", "post_layer_mix",
                                                 "comb_res_mix"))
    if layout == "0.22.0":
        out[f"{V4}.DeepseekV4DecoderLayer.hc_pre"] = Signature(
            ("self", "x", "hc_fn", "hc_scale", "hc_base", "norm_weight", "norm_eps"))
        out[f"{MHC_OP}.MHCFusedPostPreOp.forward_cuda"] = Signature(("self", *_FUSED))
        return out
    out[f"{MHC}.mhc_pre_tilelang"] = Signature(_PRE)
    out[f"{MHC}.mhc_fused_post_pre_tilelang"] = Signature(_FUSED)
    if layout >= "0.28.0":
        out[f"{MHC}.mhc_pre_broadcast_tilelang"] = Signature((*_PRE, "fn_broadcast"))
    if layout >= "0.34.0":
        out[f"{MHC}.mhc_fused_post_pre_tilelang_reuse_residual"] = Signature(_FUSED)
    return out


SIGNATURES: dict[str, dict[str, Signature]] = {layout: _signatures(layout) for layout in LAYOUTS}
# A target whose source definition is elsewhere than where it is hooked (a re-export): the
# static checks read the signature there; the install-time check reads the live object.
DEFINED_AT = {f"{FLASHMLA}.flash_mla_with_kvcache": FLASHMLA_DEF}


# -- the calls in vLLM's source the hooks rely on ----------------------------------------------
_MLA_KW = frozenset({"q", "k_cache", "head_dim_v", "softmax_scale", "indices", "topk_length",
                     "attn_sink", "extra_k_cache", "extra_indices_in_kvcache",
                     "extra_topk_length", "is_fp8_kvcache"})
_DECODE_WITHIN = {"0.20.0": "DeepseekV4MLAAttention._forward_decode",
                  "0.22.0": "DeepseekV4FlashMLASparseImpl._forward_decode"}


def decode_calls(layout: str) -> tuple[VllmCall, ...]:
    """mma-decode: the V4 attention's FlashMLA call passes the keywords the hook reads."""
    within = _DECODE_WITHIN.get(layout, "DeepseekV4FlashMLAAttention._forward_decode")
    return (VllmCall(
        attention_module(layout), within, "flash_mla_with_kvcache", _MLA_KW,
        "the hook reads exactly these keyword arguments (FlashMLA's sparse FP8 decode)"),)


def mhc_calls(layout: str) -> tuple[VllmCall, ...]:
    """mhc-bf16, where the kernels are called by name: the decoder layer hands the pre its
    RMSNorm."""
    if layout < "0.24.0":
        return ()
    return (VllmCall(V4, "DeepseekV4DecoderLayer.forward", "mhc_pre_tilelang",
                     frozenset({"norm_weight", "norm_eps"}),
                     "the hook fuses the RMSNorm the caller hands it", keywords_only=False),)


def per_layout(fn: Callable[[str], tuple[T, ...]]) -> dict[str, tuple[T, ...]]:
    """layout -> fn(layout), for every vLLM hook layout (a patch's `VllmDelivery` fields)."""
    return {layout: fn(layout) for layout in LAYOUTS}
