"""fp8-wo-a-gemm — the attention output absorb GEMM (`wo_a`) in FP8 through DeepGEMM.

Speeds up: `wo_a` runs as DeepGEMM's `fp8_einsum` on its FP8 128×128 block-scaled weight
instead of dequantising it to bf16 at load (`deepseek_v4.py`, `wo_a_fp8_gemm_enabled`; read
once at import). Upstream switch `SGLANG_OPT_FP8_WO_A_GEMM` (default on); SGLang forces it off
on SM120 up to 0.5.20 and leaves it opt-in from 0.5.21 (only recent DeepGEMM builds ship the
SM120 kernels; `serving_hook.py` turns it off again when DeepGEMM's JIT is missing, which the
plugin's receipt then reports).

Numerical risk (tier 2): FP8 activations into the attention output projection of every layer.

How to verify: a bisect against the same release with the switch off (bf16 `wo_a`). Not
modelled by the embedded engine: inert there.
"""

from __future__ import annotations

from dsv4bisect.patching.spec import Condition, Patch, SglangDelivery, SglangRule, Variant

VAR = "SGLANG_OPT_FP8_WO_A_GEMM"
_SWITCH = dict(on={VAR: "1"}, off={VAR: "0"}, read_once=(
    f"deepseek_v4.py reads {VAR} once at import (`_FP8_WO_A_GEMM`) and the weight loader "
    "dequantises wo_a to bf16 when it is off: fixed at load"))

PATCH = Patch(
    name="fp8-wo-a-gemm",
    summary="attention wo_a GEMM in FP8 via DeepGEMM fp8_einsum (SGLANG_OPT_FP8_WO_A_GEMM)",
    tier=2,
    touches=("attention.wo_a",),
    reference="not modelled (the embedded wo_a is a bf16/fp32 GEMM)",
    sglang=SglangDelivery(hooks={}, rules=(
        SglangRule((0, 5, 13), (0, 5, 20), "upstream", archs=("sm120",), evidence=(
            f"0.5.13-0.5.20 set {VAR}=False on SM120 unconditionally (server_args.py, "
            "arg_groups/model_hook.py): the FP8 path is never taken, not switchable")),
        SglangRule((0, 5, 21), None, "env", archs=("sm120",), **_SWITCH, evidence=(
            f"from 0.5.21 SGLang sets {VAR}=False on SM120 only when unset "
            "(arg_groups/model_hook.py): opt-in")),
        SglangRule((0, 5, 13), None, "env", archs=("sm100", "sm90"), **_SWITCH, evidence=(
            f"deepseek_v4.py reads {VAR} at import (environ.py default True)")),
    )),
    variants=(Variant("fp8", "DeepGEMM fp8_einsum on the FP8 wo_a weight"),),
    inert_when=(Condition("the embedded engine does not model the FP8 wo_a GEMM",
                          lambda ctx: ctx.kind == "reference"),),
    embedded="not modelled: inert",
    doc=__doc__ or "",
)
