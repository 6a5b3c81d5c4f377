"""Every SGLang symbol the plugin hooks, per layout, with the signature it expects.

The patches declare their targets (`PATCH.sglang.hooks`, and the symbols their hook bodies call:
`PATCH.sglang.uses`); this table adds what a target must
look like for the hook to be correct: the parameter names in order (`exact`), or the names it
must at least have (an AFTER hook on a long `__init__` reads attributes, not arguments).
The same table drives the install-time check (inspect.signature of the live object), the static
check of a source tree (`plugin/static.py`) and `doctor`. Targets outside SGLang (`flashinfer.…`)
are checked at install time only; statically, their SGLang call site is checked instead
(`PATCH.sglang.calls`). Imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4bisect.base.versions import LAYOUTS

_V4_MOD = "sglang.srt.models.deepseek_v4"
_V4 = f"{_V4_MOD}.DeepseekV4DecoderLayer"
_V4_BASE = f"{_V4_MOD}.DeepseekV4DecoderLayerBase"  # 0.5.23: DeepseekV4DecoderLayer is an alias
_HASH = "sglang.srt.layers.moe.hash_topk.HashTopK"
_MLA_OLD = "sglang.srt.layers.attention.flash_mla_sm120"
_MLA_NEW = "sglang.kernels.ops.attention.flash_mla_sm120"  # moved in 0.5.16
_IDX = "sglang.srt.layers.attention.dsv4.indexer"
_QUANT = "sglang.srt.layers.quantization.modelopt_quant"
_FUSED = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE"
_TRTLLM = "sglang.srt.layers.moe.moe_runner.flashinfer_trtllm"
_SINKHORN_OLD = "sglang.srt.layers.mhc.hc_split_sinkhorn"
_SINKHORN_NEW = "sglang.kernels.ops.layernorm.mhc.hc_split_sinkhorn"  # moved in 0.5.16
_FUSED_GUARD_OLD = f"{_V4_MOD}._is_fused_mhc_post_pre_enabled"
# 0.5.19: the layer asks this (in the new deepseek_common module) whether post+pre is fused
_FUSED_GUARD_NEW = ("sglang.srt.models.deepseek_common.amd.deepseek_v4_fused_mhc."
                    "is_cross_layer_mhc_fusion_enabled")

# The plugin's own observer (not a patch): the routed-scaling contract per MoE layer.
CONTRACT_TARGET = "sglang.srt.models.deepseek_v2.DeepseekV2MoE.__init__"


@dataclass(frozen=True)
class Signature:
    params: tuple[str, ...]
    exact: bool = True  # False: these names must be present (in this order), others may be too
    external: bool = False  # defined outside SGLang (checked at install time only)

    def mismatch(self, names: tuple[str, ...]) -> str | None:
        """Why `names` does not fit, or None."""
        if self.exact:
            if names != self.params:
                return f"expected parameters ({', '.join(self.params)}), found ({', '.join(names)})"
            return None
        it = iter(names)
        missing = [p for p in self.params if p not in it]
        return f"missing parameters {', '.join(missing)}" if missing else None


_HC_PRE = ("self", "x", "hc_fn", "hc_scale", "hc_base", "norm")
_HASH_INIT = ("self", "topk", "num_experts", "num_fused_shared_experts", "vocab_size",
              "scoring_func", "routed_scaling_factor", "apply_routed_scaling_factor_on_output")
_HASH_FWD = ("self", "hidden_states", "router_logits", "input_ids", "num_token_non_padded",
             "expert_location_dispatch_info")
_INDEXER = ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table", "deep_gemm_metadata",
            "max_seq_len", "clean_logits")
_SINKHORN = ("mixes", "hc_scale", "hc_base", "hc_mult", "sinkhorn_iters", "eps")
_QUANT_COMMON = {
    f"{_QUANT}.ModelOptFp4Config.get_quant_method": Signature(("self", "layer", "prefix")),
    f"{_QUANT}.ModelOptMixedPrecisionConfig.get_quant_method": Signature(
        ("self", "layer", "prefix")),
    f"{_FUSED}.__init__": Signature(("self", "num_experts", "hidden_size", "intermediate_size",
                                     "layer_id"), exact=False),
    f"{_QUANT}.ModelOptNvFp4FusedMoEMethod.process_weights_after_loading": Signature(
        ("self", "layer")),
    f"{_HASH}.forward": Signature(_HASH_FWD),
    f"{_IDX}.fp8_paged_mqa_logits_torch_sm120": Signature(_INDEXER),
    CONTRACT_TARGET: Signature(("self", "config", "layer_id"), exact=False),
}
_FLASHINFER_FP4 = ("routing_logits", "routing_bias", "hidden_states", "hidden_states_scale")


# Where each moving symbol lives, per layout (read from each release's wheel):
#   0.5.14  hc_pre takes forward_batch; HashTopK applies the routed scaling itself
#   0.5.16  flash_mla_sm120 and the mHC kernels moved under sglang.kernels.ops
#   0.5.19  the fused-mHC guard moved to models/deepseek_common/amd/deepseek_v4_fused_mhc.py
#   0.5.21  the SM120 decode call moved into DeepseekV4AttnBackend._forward_attention
#   0.5.23  DeepseekV4DecoderLayer became an alias; hc_pre lives on DeepseekV4DecoderLayerBase
def hc_pre_target(layout: str) -> str:
    return f"{_V4_BASE if layout >= '0.5.23' else _V4}.hc_pre"


def mla_module(layout: str) -> str:
    return _MLA_OLD if layout in ("0.5.13", "0.5.14") else _MLA_NEW


def sinkhorn_target(layout: str) -> str:
    return _SINKHORN_OLD if layout in ("0.5.13", "0.5.14") else _SINKHORN_NEW


def fused_guard_target(layout: str) -> str:
    return _FUSED_GUARD_OLD if layout in ("0.5.13", "0.5.14", "0.5.16") else _FUSED_GUARD_NEW


def _layout(layout: str) -> dict[str, Signature]:
    return {
        **_QUANT_COMMON,
        f"{mla_module(layout)}.flash_mla_with_kvcache_sm120": Signature(("kwargs",)),
        hc_pre_target(layout): Signature(_HC_PRE if layout == "0.5.13"
                                         else (*_HC_PRE, "forward_batch")),
        sinkhorn_target(layout): Signature(_SINKHORN),  # called by the mhc-bf16 hook body
        fused_guard_target(layout): Signature(()),  # asked by the mhc-bf16 install check
    }


SIGNATURES: dict[str, dict[str, Signature]] = {layout: _layout(layout) for layout in LAYOUTS}
SIGNATURES["0.5.13"].update({
    f"{_HASH}.__init__": Signature(_HASH_INIT),
    # trtllm-clamp on 0.5.13: the kernel entry points SGLang imports at call time
    "flashinfer.fused_moe.trtllm_fp4_block_scale_moe": Signature(
        _FLASHINFER_FP4, exact=False, external=True),
    "flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe": Signature(
        (), exact=False, external=True),
})


_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"
_TRTLLM_CALLER = "fused_experts_none_to_flashinfer_trtllm_fp4"


def mla_caller(layout: str) -> tuple[str, str]:
    """(module, function) where DeepseekV4AttnBackend calls the SM120 decode kernel."""
    within = ("DeepseekV4AttnBackend._forward_attention" if layout >= "0.5.21"
              else "DeepseekV4AttnBackend.forward")
    return _BACKEND, within


def trtllm_caller() -> tuple[str, str]:
    """(module, function) that calls the flashinfer TRT-LLM NVFP4 MoE kernels (0.5.13)."""
    return _TRTLLM, _TRTLLM_CALLER
