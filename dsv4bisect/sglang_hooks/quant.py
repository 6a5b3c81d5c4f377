"""nvfp4-dispatch and trtllm-clamp: construction- and load-time hooks on the MoE quant methods.

nvfp4-dispatch (`hybrid`): AROUND both ModelOpt configs' `get_quant_method` and AFTER
`FusedMoE.__init__`, logging per MoE layer the method chosen, the runner backend it resolved,
`should_fuse_routed_scaling_factor_in_topk` and whether the runner scales. The per-layer
FP8/NVFP4 choice itself is upstream's (`modelopt_mixed`), so on SGLang this patch records the
dispatch rather than changing it (docs/sglang.md). `weights-only` (W4A16) has no faithful
SGLang hook and is refused.

trtllm-clamp: 0.5.13 never sets a clamp on the TRT-LLM NVFP4 path. AFTER
`process_weights_after_loading` puts `swiglu_limit` into the layer's runner config (SGLang then
passes `full(limit)` to the kernel: the raw limit, i.e. the `ignore-alpha` fault); for `alpha`
an AROUND on the flashinfer kernel entries divides it by `output1_scale_gate_scalar` (the
per-expert g1 alphas), as upstream 0.5.14 does. On 0.5.14 `alpha` is upstream (inert) and
`ignore-alpha` overwrites the layer's `gemm1_clamp_limit` with the raw limit.
"""

from __future__ import annotations

from typing import Any

from dsv4bisect.patchspec.plan import HookSpec, Plan, Recorder, first_call
from dsv4bisect.sglang_hooks.contract import backend_name, runner_scales

_QUANT = "sglang.srt.layers.quantization.modelopt_quant"
GET_FP4 = f"{_QUANT}.ModelOptFp4Config.get_quant_method"
GET_MIXED = f"{_QUANT}.ModelOptMixedPrecisionConfig.get_quant_method"
FUSED_INIT = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.__init__"
PROCESS = f"{_QUANT}.ModelOptNvFp4FusedMoEMethod.process_weights_after_loading"
FI_MOE = "flashinfer.fused_moe.trtllm_fp4_block_scale_moe"
FI_ROUTED = "flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe"
TRTLLM = ("flashinfer_trtllm", "flashinfer_trtllm_routed")


def dispatch_row(layer: Any) -> dict[str, Any]:
    qm = getattr(layer, "quant_method", None)
    method = type(qm).__name__
    backend = backend_name(layer)
    should_fuse = bool(getattr(layer, "should_fuse_routed_scaling_factor_in_topk", False))
    cfg = getattr(layer, "moe_runner_config", None)
    runner, rule = runner_scales(method, backend, should_fuse,
                                 getattr(cfg, "routed_scaling_factor", None) is not None)
    return {"layer_id": getattr(layer, "layer_id", None), "method": method, "backend": backend,
            "should_fuse_routed_scaling_factor_in_topk": should_fuse, "runner_scales": runner,
            "rule": rule, "swiglu_limit": getattr(cfg, "swiglu_limit", None)}


def dispatch_plan(variant: str, layout: str, rec: Recorder) -> Plan:
    if variant != "hybrid":
        return Plan("refuse", reason=(
            f"nvfp4-dispatch:{variant} has no faithful SGLang hook (W4A16 NVFP4 experts are "
            "SGLang's Marlin path: select it with --moe-runner-backend marlin instead)"))
    mark = first_call(rec, FUSED_INIT)

    def choose(original: Any, self: Any, layer: Any, prefix: str) -> Any:
        method = original(self, layer, prefix)
        if type(layer).__name__.endswith("MoE"):
            rec.log("quant_method", {"prefix": prefix, "config": type(self).__name__,
                                     "method": type(method).__name__})
        return method

    def after_init(result: Any, self: Any, *args: Any, **kwargs: Any) -> None:
        mark()
        rec.log("layers", dispatch_row(self))

    hooks = (HookSpec(GET_FP4, "around", choose), HookSpec(GET_MIXED, "around", choose),
             HookSpec(FUSED_INIT, "after", after_init, on_path=True))
    return Plan("install", hooks, notes=(
        "SGLang dispatches FP8/NVFP4 per layer upstream (modelopt_mixed); this hook logs the "
        "per-layer method, backend and routed-scaling owner (receipt detail)",))


def _limit_to_runner(layer: Any, method: Any) -> float | None:
    """0.5.13: put swiglu_limit into the runner config of an NVFP4 layer on TRT-LLM."""
    cfg = layer.moe_runner_config
    limit = getattr(cfg, "swiglu_limit", None)
    if limit is None or not getattr(cfg, "is_gated", True):
        return None
    if not getattr(method, "enable_flashinfer_trtllm_moe", False):
        return None
    cfg.gemm1_clamp_limit = float(limit)
    return float(limit)


def divide_by_alpha(original: Any, *args: Any, **kwargs: Any) -> Any:
    """Kernel entry AROUND: clamp limit per expert = limit / g1_alpha (clamp before alpha)."""
    clamp, alpha = kwargs.get("gemm1_clamp_limit"), kwargs.get("output1_scale_gate_scalar")
    if clamp is not None and alpha is not None:
        kwargs["gemm1_clamp_limit"] = (clamp / alpha).float()
    return original(*args, **kwargs)


def clamp_plan(variant: str, layout: str, rec: Recorder) -> Plan:
    if variant not in ("alpha", "ignore-alpha"):
        return Plan("refuse", reason=f"trtllm-clamp has no variant {variant!r} on SGLang")
    if layout != "0.5.13" and variant == "alpha":
        return Plan("inert", reason="SGLang >= 0.5.14 sets gemm1_clamp_limit = swiglu_limit / "
                                    "g1_alphas itself")
    mark = first_call(rec, PROCESS)

    def after_process(result: Any, self: Any, layer: Any, *args: Any, **kwargs: Any) -> None:
        mark()
        if layout == "0.5.13":
            limit = _limit_to_runner(layer, self)
        else:
            limit = _raw_limit_0514(layer)
        rec.log("layers", {"layer_id": getattr(layer, "layer_id", None), "clamp_limit": limit,
                           "on_trtllm_path": limit is not None})

    hooks = [HookSpec(PROCESS, "after", after_process, on_path=True)]
    if layout == "0.5.13" and variant == "alpha":
        hooks += [HookSpec(FI_MOE, "around", divide_by_alpha),
                  HookSpec(FI_ROUTED, "around", divide_by_alpha)]
    return Plan("install", tuple(hooks))


def _raw_limit_0514(layer: Any) -> float | None:
    """0.5.14 `ignore-alpha`: overwrite the per-expert limit with the raw swiglu_limit."""
    import torch

    clamp = getattr(layer, "gemm1_clamp_limit", None)
    limit = getattr(layer.moe_runner_config, "swiglu_limit", None)
    if clamp is None or limit is None:
        return None
    with torch.no_grad():
        clamp.fill_(float(limit))
    return float(limit)
