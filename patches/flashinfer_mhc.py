"""flashinfer-mhc — `hc_pre` through FlashInfer's `mhc_pre_big_fuse` and a TF32 prenorm GEMM.

Speeds up: the mixing GEMM of `hc_pre` runs as DeepGEMM's `tf32_hc_prenorm_gemm` and the
Sinkhorn/collapse as FlashInfer's fused `mhc_pre_big_fuse` (`deepseek_v4.py`,
`_flashinfer_hc_pre`). Upstream switch `SGLANG_OPT_USE_FLASHINFER_MHC` (0.5.18+, default off);
it is read at every `hc_pre` call, ahead of the TileLang and torch branches.

Numerical risk (tier 1): TF32 operands (10-bit mantissa) in a K = 16384 reduction at every mHC
site `hc_pre` is called at.

How to verify: a bisect against the same release with the switch off. The embedded engine rounds
x and `hc_fn` to TF32 before an fp32 GEMM; FlashInfer's fused Sinkhorn is not reproduced.
"""

from __future__ import annotations

from dsv4bisect.patches.mhc_bf16 import mixes_in
from dsv4bisect.patchspec.spec import Mask, Patch, SglangDelivery, SglangRule, Variant, VllmDelivery
from dsv4bisect.patchspec.swaps import Op, Swap
from dsv4bisect.vllm_hooks import SGLANG_SWITCH

VAR = "SGLANG_OPT_USE_FLASHINFER_MHC"

PATCH = Patch(
    name="flashinfer-mhc",
    summary="hc_pre by FlashInfer mhc_pre_big_fuse + TF32 GEMM (SGLANG_OPT_USE_FLASHINFER_MHC)",
    tier=1,
    touches=("mhc.hc_pre",),
    reference="hc_pre mixes with TF32-rounded operands, fp32 accumulation",
    sglang=SglangDelivery(hooks={}, rules=(
        SglangRule((0, 5, 13), (0, 5, 17), "absent", evidence=(
            f"{VAR} first appears in 0.5.18 (environ.py)")),
        SglangRule((0, 5, 18), None, "env", on={VAR: "1"}, off={VAR: "0"}, evidence=(
            f"deepseek_v4.py hc_pre: `if envs.{VAR}.get()` -> _flashinfer_hc_pre, before the "
            "TileLang and torch branches; environ.py default False")),
    )),
    variants=(Variant("tf32", "TF32 prenorm GEMM and FlashInfer's fused pre kernel"),),
    masked_by=(Mask("mhc-bf16", "the mhc-bf16 hook replaces hc_pre, where the FlashInfer branch "
                    "is chosen"),),
    embedded="TF32-rounded operands in the hc_pre mixing GEMM",
    vllm=VllmDelivery("absent", SGLANG_SWITCH),
    doc=__doc__ or "",
    swaps=(Swap(Op.MHC_MIXES, mixes_in("tf32")),),
)
