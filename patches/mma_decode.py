"""mma-decode — split-K tensor-core ("MMA") decode attention for DeepSeek-V4's MQA.

Speeds up: sparse decode attention. DeepSeek-V4 attends with 64 query heads that share one
512-dim K=V head, so the heads form the M dimension of a matrix product and tensor cores apply.
The stock SM120 kernel (`flash_mla_sparse_decode_triton`, "tiled V2") runs one program per
(token, head) with vector multiply-reduce and no split over keys; the patch splits every key list
(top-k compressed entries, sliding-window pages) into 64-key chunks, computes each chunk's
partial output and log-sum-exp with `tl.dot`, and merges the partials.

Numerical risk (tier 2): partial outputs are kept in bf16 and merged by LSE, one rounding per
split, so the error grows with the number of splits — with context length on the HCA layers
(ratio 128), which attend to every compressed entry (1024 entries = 16 splits at 128K). On SM120
SGLang 0.5.13 also sends extend batches of up to 11673 query tokens through this kernel, so
prefill (and teacher-forced scoring) sees it too.

How to verify: `dsv4bisect microtest mma-decode` (error against fp32 attention as a function of
context length); the `merge-no-rescale` fault variant shows what a broken merge looks like: it is
exact for one split and wrong as soon as a query needs two. Two field faults hang here, on the
backend's FP8 KV pages (embedded engine only, `precision: deployment`; the SGLang hook refuses
them): `batch-kv-slot` (concurrency-only corruption) and `decode-rope-fp8` (prefill/decode
divergence with FP8 KV). Two more act on what this backend's kernel reads, at both
precisions (embedded engine only as well): `compress-rope-base` (the compressed entries written to the pages with the main
layers' RoPE base; the kernel reads window keys and compressed entries in one key list, and no
patch of the registry owns the compressor's RoPE, which is where the field port went wrong) and
`swa-ring-stale` (the backend keeps the sliding window per request slot, outside the prefix
cache, so a hit reads a stale window; the window's layout is the attention backend's, and the
radix cache is no patch's code), `dsv4bisect.reference.faults`.

Upstream site: `sglang.srt.layers.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120`
(called from `DeepseekV4AttnBackend.forward`; FP8 "MODEL1" paged KV: 448 FP8-E4M3 nope dims with a
UE8M0 scale per 64 and 64 bf16 rope dims).
"""

from __future__ import annotations

from dsv4bisect.base.versions import LAYOUTS
from dsv4bisect.patching.spec import Patch, SglangDelivery, SglangRule, Variant
from dsv4bisect.plugin.targets import mla_module

PATCH = Patch(
    name="mma-decode",
    summary="split-K tensor-core decode attention (64-key splits, bf16 partials, LSE merge)",
    tier=2,
    touches=("attention.sparse_decode", "attention.prefill<=11673"),
    reference="attention over each key list split into 64-key chunks, bf16 partials, fp32 LSE merge",
    sglang=SglangDelivery(
        hooks={layout: (f"{mla_module(layout)}.flash_mla_with_kvcache_sm120",)
               for layout in LAYOUTS},
        rules=(SglangRule((0, 5, 13), None, "absent", archs=("sm100", "sm90"), evidence=(
            "SGLang calls flash_mla_with_kvcache_sm120 only on SM120 (deepseek_v4_backend.py); "
            "other GPUs decode through FlashMLA/DeepGEMM")),),
    ),
    variants=(
        Variant("split-k", "64-key splits, partial outputs in bf16, LSE merge in fp32"),
        Variant("split-k-fp32", "the same splits with fp32 partials (isolates the bf16 rounding)"),
        Variant(
            "merge-no-rescale",
            "merges partials by their local sums without rescaling to the global max",
            fault=True,
        ),
        Variant(
            "batch-kv-slot",
            "in a batch of requests, each later request's first new KV slot gets the previous "
            "request's row",
            fault=True,
            citation="sglang#33397",
            showed=("progressive corruption only under concurrency with the DeepSeek-V4 backend "
                    "and FP8 KV: 6/11 long outputs corrupt vs 0/19 short on 30 replays of one "
                    "request, identifiers altered in 2 % of requests at T=0, scaling with "
                    "concurrency"),
        ),
        Variant(
            "decode-rope-fp8",
            "the decode kernel reads the page's bf16 rope dims as FP8-E4M3 (prefill reads them right)",
            fault=True,
            citation="sglang#25790",
            showed=("logprobs of the same tokens diverge between prefill and decode (from token "
                    "96 on), only with --kv-cache-dtype fp8_e4m3"),
        ),
        Variant(
            "compress-rope-base",
            "compressed KV entries rotated with the main layers' RoPE base (rope_theta + YaRN) "
            "instead of compress_rope_theta; queries and window keys right",
            fault=True,
            citation="mlx-lm PR #1189; vllm-ascend fork (GDzhu01) #76",
            showed=("collapse into repetition once a query must look past the 128-token sliding "
                    "window (everything from about 210 tokens on), fine inside it: the port "
                    "rotated DeepSeek-V4-Flash's compressed layers with rope_theta 10000 + YaRN "
                    "instead of compress_rope_theta 160000 + YaRN; deterministic completions"),
        ),
        Variant(
            "swa-ring-stale",
            "on a prefix-cache hit the window rows are read from the request slot's ring "
            "(the slot's previous occupant's rows, zeros if never used)",
            fault=True,
            citation="sglang PR #30339; ROCm/ATOM#1417",
            showed=("a request reusing a cached prefix reads its sliding window from a "
                    "per-request-slot ring that the radix cache never restores: stale rows of "
                    "an unrelated request (SGLang unified_kv backend on ROCm) or an empty ring "
                    "(ATOM: immediate EOS / empty completion on a repeated 7.7k prompt); exact "
                    "without prefix caching"),
        ),
    ),
    doc=__doc__ or "",
)
