"""trtllm-clamp: SwiGLU clamp activity on the real experts, and the clamp's error on TRT-LLM.

For the sampled experts of a layer and the layer's MoE inputs: the share of gate activations
above `swiglu_limit` and of up activations beyond ±limit (how much the clamp does at all). The
fp32 reference is `w2(silu(min(gate, L)) · clamp(up, ±L))`. The TRT-LLM NVFP4 kernel clamps the
GEMM-1 output *before* its per-expert alpha (activation global scale × weight global scale), so:
- `alpha` (the patch): clamp the pre-alpha output at L / alpha, then multiply by alpha — equal to
  the reference up to fp32 rounding;
- `ignore-alpha`†: clamp the pre-alpha output at L — a clamp at L·alpha in real units (counted
  only when that variant is asked for);
- stock SGLang 0.5.13: no clamp on that path (informational).
Inert unless the MoE backend is flashinfer TRT-LLM with NVFP4 experts (noted in every row).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4bisect.microtest import experts as ex
from dsv4bisect.microtest.context import Context
from dsv4bisect.microtest.results import Row
from dsv4bisect.microtest.tolerances import CLAMP_REL

PATCH = "trtllm-clamp"
_INERT = "acts only under flashinfer_trtllm[_routed] with NVFP4 experts"


def applies(ctx: Context, layer: int) -> bool:
    return True


def needs(ctx: Context, layer: int) -> list[str]:
    return ex.needs(ctx, layer)


def outputs(e: ex.ExpertWeights, x: torch.Tensor, limit: float) -> dict[str, torch.Tensor]:
    """Expert outputs [T, hidden] of the reference, the two clamp variants and stock; counts."""
    gate, up = x @ e.w1.T, x @ e.w3.T  # [T, inter]
    a_g = ex.activation_scale(x, e)  # [T, 1]
    alpha_g, alpha_u = (a_g * e.g1).clamp_min(1e-30), (a_g * e.g3).clamp_min(1e-30)
    pre_g, pre_u = gate / alpha_g, up / alpha_u  # the kernel's pre-alpha GEMM-1 accumulators

    def kernel(lim_g: torch.Tensor, lim_u: torch.Tensor) -> torch.Tensor:
        g = torch.minimum(pre_g, lim_g) * alpha_g  # clamp, then the per-expert alpha
        u = torch.maximum(torch.minimum(pre_u, lim_u), -lim_u) * alpha_u
        return F.silu(g) * u

    ref = F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
    raw = torch.full_like(alpha_g, limit)
    return {"ref": ref @ e.w2.T, "alpha": kernel(limit / alpha_g, limit / alpha_u) @ e.w2.T,
            "ignore-alpha": kernel(raw, raw) @ e.w2.T, "stock": (F.silu(gate) * up) @ e.w2.T,
            "gate_over": (gate > limit).float().sum(), "up_over": (up.abs() > limit).float().sum(),
            "n": torch.tensor(float(gate.numel()))}


def run(ctx: Context, layer: int) -> list[Row]:
    limit = ctx.args.swiglu_limit
    x, source = ex.moe_input(ctx, layer)
    loaded = [ex.load(ctx, layer, e) for e in ex.sampled(ctx, layer)]
    sums: dict[str, float] = {}
    for e in loaded:
        out = outputs(e, x, limit)
        ref = out["ref"].double()
        for key in ("alpha", "ignore-alpha", "stock"):
            sums[key] = sums.get(key, 0.0) + float((out[key].double() - ref).square().sum())
        sums["ref"] = sums.get("ref", 0.0) + float(ref.square().sum())
        for key in ("gate_over", "up_over", "n"):
            sums[key] = sums.get(key, 0.0) + float(out[key])
    ids, stored = [e.expert for e in loaded], sorted({e.stored for e in loaded})
    detail = {"experts": ids, "stored": stored, "limit": limit, "activations": source}

    def err(key: str) -> float:
        return (sums[key] / sums["ref"]) ** 0.5 if sums["ref"] else 0.0

    mk = lambda case, metric, v, tol=None, counted=True, note=_INERT: Row(
        PATCH, (layer,), case, metric, v, tol, counted=counted, note=note, detail=detail)
    return [
        mk(f"gate > {limit:g} (activity)", "share", sums["gate_over"] / sums["n"]),
        mk(f"up beyond ±{limit:g} (activity)", "share", sums["up_over"] / sums["n"]),
        mk("alpha: clamp at limit / alpha", "rel_err", err("alpha"), CLAMP_REL,
           counted=ctx.counted(PATCH, "alpha")),
        mk("ignore-alpha †: clamp at limit · alpha", "rel_err", err("ignore-alpha"), CLAMP_REL,
           counted=ctx.counted(PATCH, "ignore-alpha")),
        mk("stock 0.5.13: no clamp", "rel_err", err("stock")),
    ]
