"""How much an NVFP4 W4A4 expert amplifies a bf16 rounding of its input, at the tiny model's and
at DeepSeek-V4-Flash's expert shapes.

    python tests/benchmarks/w4a4_sensitivity.py [--tokens 256] [--seed 0]

One routed expert (`w2(silu(w1 x) · w3 x)`, random weights as the seeded init draws them) on
random inputs x, and the same inputs rounded to bf16 (what a bf16 patch upstream of the MoE does
to its input: a relative change of about 2^-9). Printed: the relative change of the expert's
output, ‖y(bf16(x)) − y(x)‖ / ‖y(x)‖, in fp32 (`precision: exact`) and on the deployment's
W4A4 path (NVFP4 weights; GEMM inputs and the SwiGLU output quantised to NVFP4 with a per-token
global scale, as `cutlass_moe_fp4`). A small input change flips some E2M1 roundings, and each
flip moves a value by a whole E2M1 step (a third to a half of it), so the output change is set by
the FP4 step, not by the input change: the same ratio at both shapes is the evidence that the
amplification is the format's, so the real deployment has it too.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from dsv4bisect.kernels.nvfp4 import E2M1_MAX, E4M3_MAX, default_global_scale, nvfp4_fake_quant

SHAPES = {"tiny": (256, 64), "flash": (4096, 2048)}  # hidden, moe_intermediate_size
UP_GAIN = 4.0  # checkpoint.EXPERT_UP_GAIN


def _row_scale(x: torch.Tensor) -> torch.Tensor:
    return x.abs().amax(-1, keepdim=True) / (E2M1_MAX * E4M3_MAX)


def measure(tokens: int, seed: int) -> dict[str, dict[str, float]]:
    g = torch.Generator().manual_seed(seed)
    out: dict[str, dict[str, float]] = {}
    for name, (d, f) in SHAPES.items():
        w1 = torch.randn(f, d, generator=g) * UP_GAIN * d**-0.5
        w3 = torch.randn(f, d, generator=g) * UP_GAIN * d**-0.5
        w2 = torch.randn(d, f, generator=g) * f**-0.5 / UP_GAIN
        q1, q2, q3 = (nvfp4_fake_quant(w, global_scale=default_global_scale(w)) for w in (w1, w2, w3))
        x = torch.randn(tokens, d, generator=g)
        xb = x.bfloat16().float()

        def fp32(v: torch.Tensor) -> torch.Tensor:
            return (F.silu(v @ w1.T) * (v @ w3.T)) @ w2.T

        def w4a4(v: torch.Tensor) -> torch.Tensor:
            va = nvfp4_fake_quant(v, global_scale=_row_scale(v))
            h = F.silu(va @ q1.T) * (va @ q3.T)
            return nvfp4_fake_quant(h, global_scale=_row_scale(h)) @ q2.T

        row = {}
        for label, fn in (("fp32", fp32), ("w4a4", w4a4)):
            y, yb = fn(x), fn(xb)
            row[label] = float((yb - y).norm() / y.norm())
        row["ratio"] = row["w4a4"] / row["fp32"]
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    result = measure(a.tokens, a.seed)
    for name, r in result.items():
        d, f = SHAPES[name]
        print(f"{name} ({d} -> {f}): output change {r['fp32']:.3g} fp32, {r['w4a4']:.3g} W4A4 "
              f"(x{r['ratio']:.0f})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
