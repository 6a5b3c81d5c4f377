"""fused-hash-topk — HashTopK's routing by SGLang's fused CUDA kernel.

Speeds up: the hash-routed MoE layers' top-k (token-id → expert table lookup, scoring,
normalisation and the routed scaling factor) run as one kernel (`hash_topk`, from
`sglang.jit_kernel.dsv4` / `sglang.kernels.ops.moe.dsv4`) instead of `HashTopK._forward_torch`.
Upstream switch `SGLANG_OPT_USE_FUSED_HASH_TOPK` (default on), read at every forward.

Numerical risk (tier 3): the kernel computes the same sqrt-softplus weights, normalised over the
six routed experts, as `_forward_torch` (fp32; shared/notes/sglang-dsv4.md §HashTopK), and uses
`routed_scaling_factor` only for a fused shared-expert slot's weight (1/rsf) — a reduction-order
difference, and one more place the factor is handled (the hash-topk-scaling bug class).

How to verify: a bisect against the same release with the switch off (the torch path); the
plugin's routed-scaling contract receipt. Not modelled by the embedded engine (its HashTopK has
one torch path): inert there.
"""

from __future__ import annotations

from dsv4bisect.patchspec.spec import (
    Condition,
    Patch,
    SglangDelivery,
    SglangRule,
    Variant,
    VllmDelivery,
)
from dsv4bisect.vllm_hooks import SGLANG_SWITCH

VAR = "SGLANG_OPT_USE_FUSED_HASH_TOPK"

PATCH = Patch(
    name="fused-hash-topk",
    summary="HashTopK routing by SGLang's fused kernel (SGLANG_OPT_USE_FUSED_HASH_TOPK)",
    tier=3,
    touches=("moe.hash_topk", "moe.routed_scaling"),
    reference="not modelled (the embedded HashTopK has one torch path)",
    sglang=SglangDelivery(hooks={}, rules=(
        SglangRule((0, 5, 13), None, "env", on={VAR: "1"}, off={VAR: "0"}, evidence=(
            f"hash_topk.py HashTopK.forward: `elif envs.{VAR}.get()` -> fused hash_topk "
            "kernel, else _forward_torch (environ.py default True)")),
    )),
    variants=(Variant("fused", "SGLang's fused hash top-k kernel"),),
    inert_when=(Condition("the embedded engine does not model SGLang's fused hash top-k kernel",
                          lambda ctx: ctx.kind == "reference"),),
    embedded="not modelled: inert",
    vllm=VllmDelivery("absent", SGLANG_SWITCH),
    doc=__doc__ or "",
)
