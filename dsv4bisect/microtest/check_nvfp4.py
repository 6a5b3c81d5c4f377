"""nvfp4-dispatch: the per-layer quant-method map, and NVFP4's error on the real expert weights.

Method map (one row per layer): the stored format of the sampled routed experts, the shared
expert and `wq_a`, what the quantisation map declares for them, the FusedMoE method the hybrid
dispatch gives the experts and the one stock SGLang's config class gives them (`modelopt_fp4`: not
excluded -> NVFP4, excluded -> unquantised; `modelopt_mixed`: per `quantized_layers`). A module
whose stored 4-bit format (NVFP4 / MXFP4) disagrees with the declared one is a mismatch (FAIL):
SGLang would build the wrong method for it.

NVFP4 error: where the experts are held in a higher precision (bf16/fp32/FP8, or MXFP4), each
sampled expert's w1/w2/w3 is NVFP4-quantised (E2M1, E4M3 per 16, fp32 global amax/(6·448);
the Triton quantiser on CUDA) and compared with the stored value. An informational row gives the
expert output error on the layer's MoE inputs (W4A4 for `hybrid`, W4A16 for `weights-only`).
"""

from __future__ import annotations

import torch

from dsv4bisect.kernels.nvfp4 import E2M1_MAX, E4M3_MAX, nvfp4_fake_quant
from dsv4bisect.microtest import experts as ex
from dsv4bisect.microtest.context import Context
from dsv4bisect.microtest.results import Row
from dsv4bisect.microtest.runners import MOE_METHODS, expert_method
from dsv4bisect.microtest.tolerances import DISPATCH_MISMATCH, NVFP4_WEIGHT_REL
from dsv4bisect.reference.model import swiglu

PATCH = "nvfp4-dispatch"


def applies(ctx: Context, layer: int) -> bool:
    return True


def needs(ctx: Context, layer: int) -> list[str]:
    p = f"layers.{layer}."
    return ex.needs(ctx, layer) + [p + "ffn.shared_experts.w1.weight", p + "attn.wq_a.weight"]


def _fake_quant(ctx: Context, w: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
    if ctx.cuda:
        from dsv4bisect.kernels.nvfp4 import nvfp4_fake_quant_triton

        return nvfp4_fake_quant_triton(w, global_scale=g)
    return nvfp4_fake_quant(w, global_scale=g)


def _mismatch(declared: str, stored: str) -> bool:
    return any((declared == f) != (stored == f) for f in ("nvfp4", "mxfp4"))


def _stock_method(ctx: Context, layer: int, stored: str) -> str:
    q = ctx.weights.quant
    cls = q.config_class
    if cls in ("modelopt_fp4", "modelopt_mixed"):
        declared = q.declared(f"layers.{layer}.ffn.experts")
        if cls == "modelopt_mixed":
            declared = q.declared(f"layers.{layer}.ffn.experts.0.w1")
        return MOE_METHODS["nvfp4" if declared == "nvfp4" else "dense"]
    return MOE_METHODS[expert_method(stored)]


def method_row(ctx: Context, layer: int) -> Row:
    w, q = ctx.weights, ctx.weights.quant
    modules = [n[: -len(".weight")] for e in ex.sampled(ctx, layer)
               for n in ex.expert_names(layer, e)]
    modules += [f"layers.{layer}.ffn.shared_experts.w1", f"layers.{layer}.attn.wq_a"]
    table = {m: (w.stored_format(m + ".weight"), q.declared(m)) for m in modules}
    bad = sorted(m for m, (s, d) in table.items() if _mismatch(d, s))
    routed = sorted({s for m, (s, _) in table.items() if ".experts." in m + "."})
    hybrid = "nvfp4" if ctx.variant(PATCH) else expert_method(routed[0]) if routed else "dense"
    shared = table[modules[-2]][0]
    note = (f"experts {'/'.join(routed)} -> {MOE_METHODS[hybrid]} (stock: "
            f"{_stock_method(ctx, layer, routed[0] if routed else 'fp32')}); shared {shared}; "
            f"attn {table[modules[-1]][0]}")
    if bad:
        note = f"stored vs declared differ: {', '.join(bad[:3])}; " + note
    return Row(PATCH, (layer,), "method map", "mismatch", float(len(bad)), DISPATCH_MISMATCH,
               note=note, detail={"modules": {m: {"stored": s, "declared": d}
                                              for m, (s, d) in table.items()},
                                  "config_class": q.config_class, "hybrid": MOE_METHODS[hybrid]})


def run(ctx: Context, layer: int) -> list[Row]:
    rows = [method_row(ctx, layer)]
    loaded = [ex.load(ctx, layer, e) for e in ex.sampled(ctx, layer)]
    stored = sorted({e.stored for e in loaded})
    if stored == ["nvfp4"]:
        rows.append(Row(PATCH, (layer,), "expert weights -> NVFP4", "rel_err", float("nan"),
                        note="stored as NVFP4: no higher-precision copy to compare"))
        return rows
    err2 = ref2 = 0.0
    for e in loaded:
        for w in (e.w1, e.w2, e.w3):
            err2 += float((_fake_quant(ctx, w) - w).double().square().sum())
            ref2 += float(w.double().square().sum())
    ids = [e.expert for e in loaded]
    rows.append(Row(PATCH, (layer,), f"expert weights -> NVFP4 (from {'/'.join(stored)})",
                    "rel_err", (err2 / ref2) ** 0.5 if ref2 else 0.0, NVFP4_WEIGHT_REL,
                    note=f"experts {ids}", detail={"experts": ids, "stored": stored}))
    rows.append(output_row(ctx, layer, loaded))
    return rows


def output_row(ctx: Context, layer: int, loaded: list[ex.ExpertWeights]) -> Row:
    """Informational: expert outputs with NVFP4 weights (and activations for `hybrid`)."""
    x, source = ex.moe_input(ctx, layer)
    act = (ctx.variant(PATCH) or "hybrid") == "hybrid"
    limit = ctx.args.swiglu_limit
    err2 = ref2 = 0.0
    for e in loaded:
        ref = swiglu(x @ e.w1.T, x @ e.w3.T, limit) @ e.w2.T
        w1, w2, w3 = (_fake_quant(ctx, w) for w in (e.w1, e.w2, e.w3))
        xq = _fake_quant(ctx, x, ex.activation_scale(x, e)) if act else x
        h = swiglu(xq @ w1.T, xq @ w3.T, limit)
        h_scale = h.abs().amax(-1, keepdim=True) / (E2M1_MAX * E4M3_MAX)
        hq = _fake_quant(ctx, h, h_scale) if act else h
        got = hq @ w2.T
        err2 += float((got - ref).double().square().sum())
        ref2 += float(ref.double().square().sum())
    mode = "W4A4" if act else "W4A16"
    return Row(PATCH, (layer,), f"expert outputs, {mode}", "rel_err",
               (err2 / ref2) ** 0.5 if ref2 else 0.0, note="informational",
               detail={"activations": source, "mode": mode})
