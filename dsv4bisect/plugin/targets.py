"""Every SGLang symbol the plugin hooks, per layout, with the signature it expects.

The patches declare their targets (`PATCH.sglang.hooks`); this table adds what a target must
look like for the hook to be correct: the parameter names in order (`exact`), or the names it
must at least have (an AFTER hook on a long `__init__` reads attributes, not arguments).
The same table drives the install-time check (inspect.signature of the live object), the static
check of a source tree (`static.py`) and `doctor`. Targets outside SGLang (`flashinfer.…`) are
checked at install time only; statically, their SGLang call site is checked instead
(`CALL_CONTRACTS`). Imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

_V4 = "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayer"
_HASH = "sglang.srt.layers.moe.hash_topk.HashTopK"
_MLA = "sglang.srt.layers.attention.flash_mla_sm120"
_IDX = "sglang.srt.layers.attention.dsv4.indexer"
_QUANT = "sglang.srt.layers.quantization.modelopt_quant"
_FUSED = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE"
_TRTLLM = "sglang.srt.layers.moe.moe_runner.flashinfer_trtllm"

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
_COMMON = {
    f"{_MLA}.flash_mla_with_kvcache_sm120": Signature(("kwargs",)),
    f"{_IDX}.fp8_paged_mqa_logits_torch_sm120": Signature(_INDEXER),
    f"{_QUANT}.ModelOptFp4Config.get_quant_method": Signature(("self", "layer", "prefix")),
    f"{_QUANT}.ModelOptMixedPrecisionConfig.get_quant_method": Signature(
        ("self", "layer", "prefix")),
    f"{_FUSED}.__init__": Signature(("self", "num_experts", "hidden_size", "intermediate_size",
                                     "layer_id"), exact=False),
    f"{_QUANT}.ModelOptNvFp4FusedMoEMethod.process_weights_after_loading": Signature(
        ("self", "layer")),
    f"{_HASH}.forward": Signature(_HASH_FWD),
    CONTRACT_TARGET: Signature(("self", "config", "layer_id"), exact=False),
}
_FLASHINFER_FP4 = ("routing_logits", "routing_bias", "hidden_states", "hidden_states_scale")

SIGNATURES: dict[str, dict[str, Signature]] = {
    "0.5.13": {
        **_COMMON,
        f"{_V4}.hc_pre": Signature(_HC_PRE),
        f"{_HASH}.__init__": Signature(_HASH_INIT),
        # trtllm-clamp on 0.5.13: the kernel entry points SGLang imports at call time
        "flashinfer.fused_moe.trtllm_fp4_block_scale_moe": Signature(
            _FLASHINFER_FP4, exact=False, external=True),
        "flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe": Signature(
            (), exact=False, external=True),
    },
    "0.5.14": {
        **_COMMON,
        f"{_V4}.hc_pre": Signature((*_HC_PRE, "forward_batch")),
    },
}


@dataclass(frozen=True)
class CallContract:
    """A call in SGLang's source the hook relies on: `callee(...)` inside `module[.within]`
    passes these keywords (exactly, or at least), and with `index` set the caller uses only
    `result[index]`."""

    module: str
    within: str | None
    callee: str
    keywords: frozenset[str]
    index: int | None = None
    why: str = ""
    exact: bool = True  # False: these keywords at least


_MLA_KW = frozenset({"q", "k_cache", "head_dim_v", "softmax_scale", "indices", "topk_length",
                     "attn_sink", "extra_k_cache", "extra_indices_in_kvcache",
                     "extra_topk_length"})
_TRT_KW = frozenset({"gemm1_clamp_limit", "output1_scale_gate_scalar"})
_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"

CALL_CONTRACTS: dict[str, tuple[CallContract, ...]] = {
    "mma-decode": (
        CallContract(_BACKEND, "DeepseekV4AttnBackend.forward", "flash_mla_with_kvcache_sm120",
                     _MLA_KW, 0, "the hook returns (out, None): only out may be used"),
    ),
    "trtllm-clamp@0.5.13": (
        CallContract(_TRTLLM, "fused_experts_none_to_flashinfer_trtllm_fp4",
                     "trtllm_fp4_block_scale_moe", _TRT_KW,
                     why="the hook divides gemm1_clamp_limit by the g1 alphas", exact=False),
        CallContract(_TRTLLM, "fused_experts_none_to_flashinfer_trtllm_fp4",
                     "trtllm_fp4_block_scale_routed_moe", _TRT_KW,
                     why="the hook divides gemm1_clamp_limit by the g1 alphas", exact=False),
    ),
}
