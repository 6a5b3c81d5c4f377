"""The routed-scaling contract, checked per MoE layer when the model is built.

DeepSeek-V4 scales the routed experts' weighted sum by `routed_scaling_factor` exactly once:
either top-k multiplies its weights (`apply_routed_scaling_factor_on_output`, which SGLang sets
from `FusedMoE.should_fuse_routed_scaling_factor_in_topk`) or the MoE runner multiplies its sum.
An AFTER hook on `DeepseekV2MoE.__init__` records, per layer: the top-k module and whether it
scales (its own flag, plus the `hash-topk-scaling` hook's extra factor), the experts' quant
method and runner backend, and whether that runner scales — read from SGLang 0.5.13/0.5.14's
runners: Triton, Marlin, DeepGEMM and triton_kernels multiply by the runner config's factor;
the NVFP4 method's `cutlass_moe_fp4` fallback, flashinfer CUTLASS and TRT-LLM *routed* paths do
not; NVFP4 with Marlin does (the stock double-scale bug). Unknown combinations are recorded as
unknown, never guessed. Construction-time only: nothing runs per token.
"""

from __future__ import annotations

from typing import Any

NVFP4_METHOD = "ModelOptNvFp4FusedMoEMethod"
NVFP4_RUNNER_SCALES = {"marlin": True, "triton": False, "auto": False, "cutlass": False,
                       "flashinfer_cutlass": False, "flashinfer_trtllm_routed": False}
RUNNERS_THAT_SCALE = {"triton", "marlin", "deep_gemm", "triton_kernels", "auto"}


def backend_name(experts: Any) -> str:
    qm = getattr(experts, "quant_method", None)
    backend = getattr(qm, "_moe_runner_backend", None)
    if backend is None:
        try:
            from sglang.srt.layers.moe import get_moe_runner_backend

            backend = get_moe_runner_backend()
        except Exception:  # noqa: BLE001 - older/newer layouts: record what we can
            return "unknown"
    return str(getattr(backend, "value", backend))


def runner_scales(method: str, backend: str, should_fuse: bool,
                  configured: bool) -> tuple[bool | None, str]:
    """(does the runner multiply by rsf, the rule used). None = unknown combination."""
    if not configured:
        return False, "runner config has no routed_scaling_factor"
    if method == NVFP4_METHOD:
        if backend in NVFP4_RUNNER_SCALES:
            return NVFP4_RUNNER_SCALES[backend], f"NVFP4 method on {backend}"
        return None, f"NVFP4 method on {backend}: not classified"
    if should_fuse:
        return False, f"{method} fuses rsf into top-k on {backend}"
    if backend in RUNNERS_THAT_SCALE:
        return True, f"{method}: {backend} runner multiplies its sum by rsf"
    return None, f"{method} on {backend}: not classified"


def topk_scales(topk: Any) -> bool:
    if hasattr(topk, "apply_routed_scaling_factor_on_output"):
        return bool(topk.apply_routed_scaling_factor_on_output)
    cfg = getattr(topk, "topk_config", None)
    return bool(getattr(cfg, "apply_routed_scaling_factor_on_output", False))


def layer_row(moe: Any, hash_extra: float | None) -> dict[str, Any]:
    """One layer's contract row. hash_extra: the hash-topk-scaling hook's extra factor in
    units of rsf applications (None when that hook is not installed)."""
    experts, topk = getattr(moe, "experts", None), getattr(moe, "topk", None)
    method = type(getattr(experts, "quant_method", None)).__name__
    should_fuse = bool(getattr(experts, "should_fuse_routed_scaling_factor_in_topk", False))
    cfg = getattr(experts, "moe_runner_config", None)
    rsf = getattr(cfg, "routed_scaling_factor", None)
    backend = backend_name(experts)
    runner, rule = runner_scales(method, backend, should_fuse, rsf is not None)
    in_topk = int(topk_scales(topk)) + int(hash_extra or 0)
    times = None if runner is None else in_topk + int(runner)
    return {"layer_id": getattr(moe, "layer_id", None), "is_hash": bool(getattr(moe, "is_hash",
            False)), "topk": type(topk).__name__, "topk_applies": in_topk, "quant_method": method,
            "backend": backend, "should_fuse": should_fuse, "runner_applies": runner,
            "rule": rule, "times_applied": times, "exactly_once": None if times is None
            else times == 1, "routed_scaling_factor": rsf}
