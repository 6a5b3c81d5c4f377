"""triton-indexer — the lightning indexer's logits by a Triton kernel instead of torch.

Speeds up: the CSA indexer scores `score[b,s] = kv_scale[s] · Σ_h w[b,h] · relu(q[b,h]·k[s])`
over the paged FP8 indexer K cache, followed by top-512 block selection. On SM120 SGLang forces
the torch fallback (`SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=True`), which gathers and upcasts the whole
cache to fp32 and runs a `bmm` (memory ∝ batch · pages · 64 · 128 · 4 B; it OOMs on long prefill
chunks). The kernel streams the pages instead.

Numerical risk (tier 2): the kernel rounds the per-head dot products to bf16 before
relu·weight·sum. At long context tens of thousands of compressed blocks compete for 512 slots,
and bf16 rounding reorders near-ties, so the CSA layers attend to different blocks.

How to verify: `dsv4bisect microtest triton-indexer` (top-k selection overlap fp32 vs bf16 as a
function of context length with the real indexer weights). The `residue` field fault (embedded
engine only; the SGLang hook refuses it) shifts the selected entry ids of queries whose length
is 3 (mod 4) by one entry, the signature of vllm#55927 (`dsv4bisect.reference.faults`).

From SGLang 0.5.16 the stock torch indexer itself computes the dot products as a bf16 `bmm`
(`kv_value.to(torch.bfloat16)`), so stock is no longer the fp32 path: the `bf16` variant is
close to it (CPU: within 1e-7 relative; H200: 7.5e-4, where cuBLAS's bf16 GEMM rounds
differently from the kernel) and `fp32` is the more exact of the two (1.7e-3 from stock).

Upstream site: module global `sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120`
(looked up at call time by `C4IndexerBackendMixin.forward_c4_indexer`); keep
`SGLANG_FP8_PAGED_MQA_LOGITS_TORCH` true so no DeepGEMM metadata is built.
"""

from __future__ import annotations

from dsv4bisect.base.versions import LAYOUTS
from dsv4bisect.patching.spec import Mask, Patch, SglangDelivery, SglangRule, Variant

_TARGET = "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120"

PATCH = Patch(
    name="triton-indexer",
    summary="Triton indexer logits (bf16 dot products) for CSA top-k block selection",
    tier=2,
    touches=("indexer.logits", "indexer.topk-selection"),
    reference="indexer per-head dot products rounded to bf16 before relu·weight·sum and top-k",
    sglang=SglangDelivery(
        hooks={layout: (_TARGET,) for layout in LAYOUTS},
        rules=(
            SglangRule((0, 5, 13), None, "absent", archs=("sm100", "sm90"), evidence=(
                "the torch indexer fp8_paged_mqa_logits_torch_sm120 is SGLang's SM120 path; "
                "other GPUs score with DeepGEMM's fp8_paged_mqa_logits")),
            SglangRule((0, 5, 16), (0, 5, 19), "upstream", archs=("sm120",), evidence=(
                "SGLang 0.5.16-0.5.19 set SGLANG_OPT_USE_TILELANG_INDEXER=True on SM120 "
                "unconditionally (server_args.py / arg_groups/model_hook.py), and the TileLang "
                "branch comes before the hooked torch indexer (dsv4/indexer.py): never called")),
        ),
    ),
    variants=(
        Variant("bf16", "per-head dot products rounded to bf16 before relu·weight·sum"),
        Variant("fp32", "fp32 accumulation throughout (only the summation order changes)"),
        Variant(
            "residue",
            "bf16 kernel; at sequence length 3 (mod 4) every selected entry id is off by one",
            fault=True,
            citation="vllm#55927; mlx-lm PR #1189",
            showed=("a needle at 28k of a 57k prompt returns a wrong last digit iff the prompt "
                    "length is 3 (mod 4), the C4 compression period (unresolved); collapse at "
                    "the 4-token compression boundary from the compressor's seqUsed"),
        ),
    ),
    masked_by=(Mask("tilelang-indexer", "SGLang's TileLang indexer branch is taken before the "
                    "hooked torch indexer, which is then never called"),),
    doc=__doc__ or "",
)
