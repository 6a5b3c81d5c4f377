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
is 3 (mod 4) by one entry, the signature of vllm#55927 (`residue_shift` in this module).

From SGLang 0.5.16 the stock torch indexer itself computes the dot products as a bf16 `bmm`
(`kv_value.to(torch.bfloat16)`), so stock is no longer the fp32 path: the `bf16` variant is
close to it (CPU: within 1e-7 relative; H200: 7.5e-4, where cuBLAS's bf16 GEMM rounds
differently from the kernel) and `fp32` is the more exact of the two (1.7e-3 from stock).

Upstream site: module global `sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120`
(looked up at call time by `C4IndexerBackendMixin.forward_c4_indexer`); keep
`SGLANG_FP8_PAGED_MQA_LOGITS_TORCH` true so no DeepGEMM metadata is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dsv4bisect.base.versions import LAYOUTS
from dsv4bisect.patchspec.spec import (
    Mask,
    Patch,
    Planners,
    SglangDelivery,
    SglangRule,
    Variant,
    VllmDelivery,
)
from dsv4bisect.patchspec.swaps import Op, Site, Swap
from dsv4bisect.sglang_hooks import attention

if TYPE_CHECKING:
    import torch

CSA_RATIO = 4  # the indexer's compression period
RESIDUE = 3  # vllm#55927: wrong iff prompt length = 3 (mod 4)


def logits_in(mode: str) -> Callable[[Site], Callable[..., torch.Tensor]]:
    """The embedded swap of the indexer's scores (`Op.INDEXER_LOGITS`, one sequence: q [T, h,
    d], w [T, h], k [S, d], n_visible [T] -> [T, S]) by the indexer kernel in `mode` (bf16:
    per-head dot products rounded to bf16; fp32), Triton on CUDA, its reference on CPU."""
    return lambda site: (lambda q, w, k, n_visible, step:
                         step.ops.indexer_patched(q, w, k, n_visible, mode=mode))


def residue_shift(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The `residue` fault (vllm#55927, mlx-lm PR #1189): ids [B, T, K] (valid first, -1 =
    none) of queries at `positions` [T]; on a CSA (ratio 4) layer, where the query's length
    (position + 1) is 3 (mod 4), every valid id moves to the next entry that query can see
    (the newest stays: there is no next one): it attends to the block after each one the
    indexer found. Exact at every other residue, so a prompt of length 3 (mod 4) answers from
    the neighbours of what the indexer found (a wrong digit, not garbage)."""
    import torch

    hit = ((positions + 1) % CSA_RATIO == RESIDUE)[None, :, None]  # [1, T, 1]
    n_visible = ((positions + 1) // CSA_RATIO)[None, :, None]
    shifted = torch.where((ids >= 0) & (ids + 1 < n_visible), ids + 1, ids)
    return torch.where(hit, shifted, ids)


def _residue(site: Site) -> Callable[..., Any]:
    """Embedded swap (`Op.INDEXER_TOPK`): the stock top-k, then `residue_shift`."""
    select = site.stock
    return lambda scores, k, step: residue_shift(select(scores, k, step), step.positions)

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
    vllm=VllmDelivery(
        "absent", "no vLLM hook: vLLM scores the lightning indexer with DeepGEMM's "
        "fp8(_fp4)_paged_mqa_logits (0.34.0: or its fused MQA top-k); the patch's site is "
        "SGLang's SM120 torch indexer, which vLLM does not have"),
    doc=__doc__ or "",
    swaps=(Swap(Op.INDEXER_LOGITS, logits_in("bf16"), ("bf16", "residue")),
           Swap(Op.INDEXER_LOGITS, logits_in("fp32"), ("fp32",)),
           Swap(Op.INDEXER_TOPK, _residue, ("residue",))),
    planners=Planners(sglang=attention.indexer_plan),
)
