"""The documented tolerance of every micro-test (docs/microtest.md explains each figure).

bf16 has 8 significant bits: one rounding to nearest costs at most 2⁻⁹ ≈ 2.0e-3 relative, and a
GEMM with bf16 operands and a bf16 output measured ~2.3e-3 (Frobenius) at the Flash mHC shape on
Gaussian data. The bf16 tolerances below sit ~4x above that floor: a real tensor that exceeds them
makes bf16 markedly worse than generic data does (cancellation, outliers, a large `hc_scale`).
"""

from __future__ import annotations

# mhc-bf16: ‖bf16 − fp32‖ / ‖fp32‖ of the mixes, pre, post, comb (after Sinkhorn) and the
# collapsed stream, per layer and site.
MHC_REL = 1e-2

# mma-decode: ‖split-K − exact‖ / ‖exact‖ of the attention output per context length.
SPLITK_BF16_REL = 1e-2  # bf16 partials (variants split-k, merge-no-rescale)
SPLITK_FP32_REL = 1e-4  # fp32 partials (variant split-k-fp32): reordering only

# triton-indexer: mean share of the fp32 top-k that the bf16 scores also select.
INDEXER_MIN_OVERLAP = 0.99

# hash-topk-scaling: |effective routed factor / routed_scaling_factor − 1| (0 when applied once;
# 0.5 on Flash when applied twice, 1/3 when never).
SCALING_REL = 1e-3

# nvfp4-dispatch: ‖NVFP4(W) − W‖ / ‖W‖ of expert weights held in a higher precision. Gaussian
# weights give 0.095 (E2M1 has one mantissa bit); 0.12 flags weights that quantise markedly worse.
NVFP4_WEIGHT_REL = 0.12
# nvfp4-dispatch: modules whose stored 4-bit format disagrees with the quantisation map.
DISPATCH_MISMATCH = 0.0

# trtllm-clamp: ‖clamped output − fp32 reference‖ / ‖reference‖ of the sampled experts. The
# `alpha` variant clamps the pre-alpha GEMM output at limit / alpha: equal up to fp32 rounding.
CLAMP_REL = 1e-5
