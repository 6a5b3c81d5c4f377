"""nvfp4-dispatch and trtllm-clamp on vLLM: construction- and load-time hooks.

nvfp4-dispatch (`hybrid`): AROUND `DeepseekV4FP8Config.get_quant_method` logs per MoE layer the
method vLLM chose (`ModelOptNvFp4FusedMoE` for NVFP4 experts, `Mxfp4MoEMethod` otherwise: the
per-layer choice is upstream's) into the receipt. `weights-only` (W4A16) is refused: on vLLM it
is an MoE backend (`--moe-backend marlin`), not a hook.

trtllm-clamp: from 0.22.0 vLLM folds the SwiGLU clamp as `swiglu_limit / g1_alphas` into
`gemm1_clamp_limit` when it processes the TRT-LLM NVFP4 experts' weights
(`TrtLlmNvFp4ExpertsBase.process_weights_after_loading`): `alpha` is upstream (inert).
`ignore-alpha` (fault) AROUND that method puts the unfolded limit back after the fold, so the
kernel clamps at `limit · alpha` in real units. 0.20.0 passes `gemm1_clamp_limit=None` to the
kernel (no clamp at all): neither variant has a faithful hook there (refused).
"""

from __future__ import annotations

from typing import Any

from dsv4bisect.patchspec.plan import HookSpec, Plan, Recorder
from dsv4bisect.patchspec.spec import EngineContext
from dsv4bisect.vllm_hooks import targets as tg


def dispatch_plan(variant: str, layout: str, rec: Recorder) -> Plan:
    if variant != "hybrid":
        return Plan("refuse", reason=f"nvfp4-dispatch:{variant} has no faithful vLLM hook "
                    "(W4A16 NVFP4 experts are vLLM's Marlin backend: --moe-backend marlin)")
    (site,) = tg.dispatch_sites(layout)

    def around(original: Any, self: Any, layer: Any, prefix: str) -> Any:
        method = original(self, layer, prefix)
        name = type(layer).__name__
        if "MoE" in name or "Experts" in name:
            rec.called(site.target)
            rec.log("quant_method", {"prefix": prefix, "layer": name,
                                     "method": type(method).__name__})
        return method

    return Plan("install", (HookSpec(site.target, "around", around, True),), notes=(
        "vLLM dispatches FP8/NVFP4 per layer upstream; this hook logs each MoE layer's method",))


def restore_unfolded(original: Any, experts: Any, layer: Any) -> float | None:
    """Run vLLM's weight processing, then put the clamp limit back as it was before the fold
    by the g1 alphas (the raw `swiglu_limit` per expert). Returns the limit, or None when this
    layer has no clamp on the TRT-LLM path."""
    raw = getattr(experts, "_gemm1_clamp_limit_unfolded", None)
    before = getattr(experts, "gemm1_clamp_limit", None)
    if raw is None and before is not None:
        raw = before.detach().clone()
    original(experts, layer)
    clamp = getattr(experts, "gemm1_clamp_limit", None)
    if clamp is None or raw is None:
        return None
    import torch

    with torch.no_grad():
        clamp.copy_(raw.to(clamp.dtype).view(clamp.shape))
    return float(raw.reshape(-1)[0])


def clamp_inert(variant: str, ctx: EngineContext) -> str | None:
    """What the resolver says of each variant before anything is sent to vLLM."""
    if ctx.vllm_version is not None and ctx.vllm_version[:3] < (0, 22, 0):
        return ("vLLM 0.20.0 passes gemm1_clamp_limit=None to the TRT-LLM NVFP4 kernels (no "
                "SwiGLU clamp to fold): no faithful hook for either variant")
    if variant == "alpha":
        return ("vLLM >= 0.22.0 folds swiglu_limit / g1_alphas into gemm1_clamp_limit itself "
                "(TrtLlmNvFp4ExpertsBase.process_weights_after_loading)")
    return None


def clamp_plan(variant: str, layout: str, rec: Recorder) -> Plan:
    if variant not in ("alpha", "ignore-alpha"):
        return Plan("refuse", reason=f"trtllm-clamp has no variant {variant!r} on vLLM")
    if layout == "0.20.0":
        return Plan("refuse", reason="vLLM 0.20.0 passes gemm1_clamp_limit=None to the TRT-LLM "
                    "NVFP4 kernels (no SwiGLU clamp at all): no faithful hook for either variant")
    if variant == "alpha":
        return Plan("inert", reason="vLLM >= 0.22.0 folds swiglu_limit / g1_alphas into "
                    "gemm1_clamp_limit itself (TrtLlmNvFp4ExpertsBase)")
    (site,) = tg.clamp_sites(layout)

    def around(original: Any, self: Any, layer: Any) -> None:
        rec.called(site.target)
        limit = restore_unfolded(original, self, layer)
        rec.log("layers", {"layer": getattr(layer, "layer_name", None), "clamp_limit": limit,
                           "on_trtllm_path": limit is not None})

    return Plan("install", (HookSpec(site.target, "around", around, True),))
