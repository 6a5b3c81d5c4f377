"""fused-mhc-post-pre — SGLang's fused mHC post+pre kernel across the sublayer boundary.

Speeds up: the hyper-connection epilogue of one sublayer (`hc_post`: the post gates and the
doubly-stochastic residual mix) and the prologue of the next (`hc_pre`: the mixing GEMM,
Sinkhorn, the stream collapse) run as one TileLang kernel (`mhc_fused_post_pre`,
`sglang/kernels/ops/layernorm/mhc.py`) instead of the fp32 torch path. Upstream switch
`SGLANG_OPT_FUSE_MHC_POST_PRE`; from 0.5.18 SGLang turns it on by default on SM120
(`server_args.py`, later `arg_groups/model_hook.py`, only when unset).

Numerical risk (tier 1): every mHC site after the first is computed by a different kernel with
its own rounding and reduction order, at 86 sites, compounding over depth like mhc-bf16.

How to verify: a bisect against the same release with the switch off (`off` sets it to 0: the
fp32 torch path); `doctor` prints the value SGLang forces on this GPU. The embedded engine models
it as bf16 mixes at every mHC site; the TileLang kernel's own rounding is not reproduced.
"""

from __future__ import annotations

from dsv4bisect.patches.mhc_bf16 import mixes_in
from dsv4bisect.patchspec.spec import (
    ARCHS,
    Patch,
    SglangDelivery,
    SglangRule,
    Variant,
    VllmDelivery,
)
from dsv4bisect.patchspec.swaps import Op, Swap
from dsv4bisect.vllm_hooks import SGLANG_SWITCH

VAR = "SGLANG_OPT_FUSE_MHC_POST_PRE"
_SWITCH = dict(on={VAR: "1"}, off={VAR: "0"}, read_once=(
    f"each decoder layer reads {VAR} once in __init__ (`self.use_fused_mhc_post_pre`, "
    "deepseek_v4.py): fixed at load"))

PATCH = Patch(
    name="fused-mhc-post-pre",
    summary="SGLang's fused mHC post+pre TileLang kernel (SGLANG_OPT_FUSE_MHC_POST_PRE)",
    tier=1,
    touches=("mhc.hc_post", "mhc.hc_pre"),
    reference="hc_pre mixes with bf16 operands at every site (models the fused kernel's rounding)",
    sglang=SglangDelivery(hooks={}, rules=(
        SglangRule((0, 5, 13), (0, 5, 16), "absent", archs=("sm120",), evidence=(
            "0.5.13-0.5.16 fuse post+pre only with SGLANG_OPT_USE_TILELANG_MHC_PRE, which SGLang "
            "forces False on SM120 (server_args.py): the fused kernel is never used there")),
        SglangRule((0, 5, 17), None, "env", archs=("sm120",), **_SWITCH, evidence=(
            "0.5.17 accepts SM120 in _is_fused_mhc_post_pre_enabled; from 0.5.18 SGLang sets "
            f"{VAR}=True on SM120 unless set (server_args.py, arg_groups/model_hook.py)")),
        SglangRule((0, 5, 13), None, "env", archs=tuple(a for a in ARCHS if a != "sm120"),
                   **_SWITCH, evidence=(
                       f"{VAR} with the TileLang mHC kernels (environ.py default False up to "
                       "0.5.17, True from 0.5.18)")),
    )),
    variants=(Variant("fused", "one TileLang kernel for hc_post and the next hc_pre"),),
    embedded="bf16 mixes at every mHC site (the mhc-bf16 numerics)",
    vllm=VllmDelivery("absent", SGLANG_SWITCH),
    doc=__doc__ or "",
    swaps=(Swap(Op.MHC_MIXES, mixes_in("bf16")),),
)
