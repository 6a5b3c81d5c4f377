"""tilelang-indexer — the lightning indexer's logits by SGLang's TileLang kernel.

Speeds up: the CSA indexer scores over the paged FP8 indexer K cache run as a TileLang kernel
instead of the torch fallback that gathers and upcasts the whole cache
(`dsv4/indexer.py`: the `SGLANG_OPT_USE_TILELANG_INDEXER` branch comes first). SGLang sets the
switch itself on SM120: unconditionally in 0.5.16-0.5.19 (then it is upstream behaviour, not a
candidate), only when unset from 0.5.20.

Numerical risk (tier 2): the kernel's reduced-precision scores reorder near-ties among tens of
thousands of compressed blocks competing for 512 slots at long context (as triton-indexer).

How to verify: a bisect against the same release with the switch off (the fp32 torch indexer,
SGLANG_FP8_PAGED_MQA_LOGITS_TORCH stays on). The embedded engine models it as bf16 per-head
dot products (the triton-indexer `bf16` numerics), not TileLang's own kernel.
"""

from __future__ import annotations

from dsv4bisect.patches.triton_indexer import logits_in
from dsv4bisect.patchspec.spec import Patch, SglangDelivery, SglangRule, Variant, VllmDelivery
from dsv4bisect.patchspec.swaps import Op, Swap
from dsv4bisect.vllm_hooks import SGLANG_SWITCH

VAR = "SGLANG_OPT_USE_TILELANG_INDEXER"
_SWITCH = dict(on={VAR: "1"}, off={VAR: "0"})

PATCH = Patch(
    name="tilelang-indexer",
    summary="CSA indexer logits by SGLang's TileLang kernel (SGLANG_OPT_USE_TILELANG_INDEXER)",
    tier=2,
    touches=("indexer.logits", "indexer.topk-selection"),
    reference="indexer per-head dot products rounded to bf16 (models the TileLang kernel)",
    sglang=SglangDelivery(hooks={}, rules=(
        SglangRule((0, 5, 13), (0, 5, 15, 1), "env", archs=("sm120",), **_SWITCH, evidence=(
            f"dsv4/indexer.py takes the TileLang branch when {VAR} (environ.py default False)")),
        SglangRule((0, 5, 16), (0, 5, 19), "upstream", archs=("sm120",), evidence=(
            f"0.5.16-0.5.19 set {VAR}=True on SM120 unconditionally (server_args.py, "
            "arg_groups/model_hook.py): upstream behaviour, not switchable")),
        SglangRule((0, 5, 20), None, "env", archs=("sm120",), **_SWITCH, evidence=(
            f"from 0.5.20 SGLang sets {VAR}=True on SM120 only when unset "
            "(arg_groups/model_hook.py)")),
        SglangRule((0, 5, 13), None, "env", archs=("sm100", "sm90"), **_SWITCH, evidence=(
            f"dsv4/indexer.py reads {VAR} on every GPU (environ.py default False)")),
    )),
    variants=(Variant("tilelang", "SGLang's TileLang indexer kernel"),),
    embedded="bf16 per-head indexer dot products (the triton-indexer bf16 numerics)",
    vllm=VllmDelivery("absent", SGLANG_SWITCH),
    doc=__doc__ or "",
    swaps=(Swap(Op.INDEXER_LOGITS, logits_in("bf16")),),
)
