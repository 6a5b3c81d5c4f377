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
radix cache is no patch's code): this module's swaps.

Upstream site: `sglang.srt.layers.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120`
(called from `DeepseekV4AttnBackend.forward`; FP8 "MODEL1" paged KV: 448 FP8-E4M3 nope dims with a
UE8M0 scale per 64 and 64 bf16 rope dims).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from dsv4bisect.base.versions import LAYOUTS
from dsv4bisect.patchspec.spec import (
    CallContract,
    Patch,
    Planners,
    SglangDelivery,
    SglangRule,
    Variant,
    VllmDelivery,
)
from dsv4bisect.patchspec.swaps import Op, Site, Swap, kernel_settings
from dsv4bisect.sglang_hooks import attention
from dsv4bisect.sglang_hooks.targets import mla_caller, mla_module
from dsv4bisect.vllm_hooks import attention as vllm_attention
from dsv4bisect.vllm_hooks import targets as vllm_targets

if TYPE_CHECKING:
    import torch

# what SGLang passes to flash_mla_with_kvcache_sm120 (the hook reads these by name)
_MLA_KW = frozenset({"q", "k_cache", "head_dim_v", "softmax_scale", "indices", "topk_length",
                     "attn_sink", "extra_k_cache", "extra_indices_in_kvcache",
                     "extra_topk_length"})


# ---- the embedded engine's swaps ----------------------------------------------------------------


def split_k(partial: str, merge: str) -> Callable[[Site], Callable[..., torch.Tensor]]:
    """`Op.ATTENTION`: every key list cut into 64-key splits, each split's partial output in
    `partial` (bfloat16 | float32) with its fp32 LSE, merged by LSE (`merge="lse"`) or, for
    the merge-no-rescale fault, by local sums without rescaling to the global max."""

    def build(site: Site) -> Callable[..., torch.Tensor]:
        import torch

        dtype = getattr(torch, partial)

        def attend(q: torch.Tensor, lists: list[Any], sink: torch.Tensor, scale: float,
                   step: Any) -> torch.Tensor:
            outs = [step.ops.attention(q[kl.rows], kl.keys, kl.idx.to(torch.int32), sink,
                                       scale, split=attention.SPLIT, partial_dtype=dtype,
                                       merge=merge)
                    for kl in lists]  # [B·T, H, D] per group
            return outs[0] if len(outs) == 1 else torch.cat(outs)

        return kernel_settings(attend, attention.SPLIT, partial, merge)

    return build


def slot_rows(groups: list[tuple[int, int, int]], n_rows: int) -> torch.Tensor:
    """Per row of a step, the row whose KV the `batch-kv-slot` fault writes there: groups are
    (first row, sequences B, tokens T) in row order; the first new row of every request but the
    step's first holds the previous request's first new row (each other row holds its own)."""
    import torch

    src = torch.arange(n_rows)
    starts = [row + b * T for row, B, T in groups for b in range(B)]
    for prev, start in pairwise(starts):
        src[start] = prev
    return src


def _batch_kv_slot(site: Site) -> Callable[..., torch.Tensor] | None:
    """`Op.KV_WRITE`, the `batch-kv-slot` fault (sglang#33397): in a forward that holds several
    requests, the FP8 KV write puts the previous request's first new row into each later
    request's first new slot (a page-slot offset off by one request). A lone request is exact;
    under concurrency every decode step of a batched request writes a foreign key, so the
    corruption grows with the output's length and the number of requests batched. On the FP8
    pages only (`precision: deployment`)."""
    if not site.deployment:
        return None
    write = site.stock

    def faulty(kv: torch.Tensor, step: Any, groups: list[Any]) -> torch.Tensor:
        shape = [(row, part.batch, part.tokens.shape[0] // part.batch)
                 for row, part, _ in groups]
        return write(kv, step, groups)[slot_rows(shape, kv.shape[0])]

    return faulty


def rope_read_as_fp8(pool: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Key rows [..., D] as a kernel that decodes the rope dims with the nope dims' FP8 format
    reads them: the rope dims through FP8-E4M3 with a UE8M0 scale per row."""
    import torch

    from dsv4bisect.kernels.fp8 import fp8_groups

    nope, rope = pool[..., :-rope_dim], pool[..., -rope_dim:]
    return torch.cat((nope, fp8_groups(rope, rope_dim)), -1)


def _decode_rope_fp8(site: Site) -> Callable[..., torch.Tensor] | None:
    """`Op.KV_READ`, the `decode-rope-fp8` fault (sglang#25790): the decode kernel (one new
    token) reads the MODEL1 page's bf16 rope dims as FP8-E4M3; prefill reads them right, so
    prefill and decode logprobs of the same tokens diverge, only with an FP8 KV cache."""
    if not site.deployment:
        return None
    rope_dim = site.args.qk_rope_head_dim
    return lambda pool, tokens: rope_read_as_fp8(pool, rope_dim) if tokens == 1 else pool


def _compress_rope_base(site: Site) -> Any:
    """`Op.COMPRESSED_ROPE`, the `compress-rope-base` fault (mlx-lm PR #1189): the compressed
    KV entries of a compressed layer rotated with the main layers' RoPE base (`rope_theta`,
    with the compressed layers' YaRN) instead of `compress_rope_theta`, as the port built its
    table; queries and window keys keep the right one. An entry at position 0 is exact; every
    later one's rope dims sit off by its position times the tables' frequency difference, so
    what only compressed entries hold (everything past the sliding window) is read wrongly."""
    return site.stock.rebased(site.args.rope_theta)


class SwaRings:
    """`Op.WINDOW_STORE`, the `swa-ring-stale` fault (sglang PR #30339; ROCm/ATOM#1417): an
    attention backend that keeps the sliding-window KV per request slot (`req_pool_idx * window
    + position % window`, SGLang's unified_kv layout) instead of in the prefix-cached pages: per
    slot and layer, `window` rows addressed by position mod window.

    Slots are handed out as SGLang's `ReqToTokenPool` does: the first free slot, a freed one
    going to the end of the free list. A request's window rows are in its slot's ring when it
    leaves (`release`); a request that resumes from a prefix-cache snapshot reads the window
    rows of the reused prefix from its own slot's ring (`restore`), not from the snapshot: what
    the slot's previous occupant wrote there (zeros in a slot never used). A request without a
    hit is exact."""

    def __init__(self, n_slots: int, window: int) -> None:
        self.window = window
        self.free: deque[int] = deque(range(n_slots))
        self.rings: dict[int, list[torch.Tensor]] = {}  # slot -> per layer [window, D]

    def admit(self, cache: Any, hit: bool) -> _Lease:
        """A request is admitted with `cache` (`hit`: resumed from the prefix cache)."""
        slot = self.alloc()
        if hit:
            self.restore(slot, cache)
        return _Lease(self, slot)

    def alloc(self) -> int:
        if not self.free:
            raise RuntimeError("no free request slot")
        return self.free.popleft()

    def release(self, slot: int, cache: Any | None) -> None:
        """The slot's occupant leaves with `cache`: its window rows stay in the slot's ring."""
        if cache is not None:
            rings = self._rings(slot, cache)
            for ring, layer in zip(rings, cache.layers, strict=True):
                ring[self._ring_index(layer.window_start, layer.window.shape[0])] = layer.window
        self.free.append(slot)

    def restore(self, slot: int, cache: Any) -> None:
        """A prefix-cache hit resumed into `slot`: every layer's window rows (positions
        window_start..n-1) become what the slot's ring holds at their ring index."""
        rings = self._rings(slot, cache)
        for ring, layer in zip(rings, cache.layers, strict=True):
            at = self._ring_index(layer.window_start, layer.window.shape[0])
            layer.window = ring[at].clone()  # a new tensor: the snapshot shares the old one

    def _ring_index(self, start: int, n: int) -> torch.Tensor:
        import torch

        return torch.arange(start, start + n) % self.window

    def _rings(self, slot: int, cache: Any) -> list[torch.Tensor]:
        if slot not in self.rings:  # a slot never used: its ring memory is zeros
            self.rings[slot] = [layer.window.new_zeros(self.window, layer.window.shape[1])
                                for layer in cache.layers]
        return self.rings[slot]


@dataclass
class _Lease:
    """A request's slot in the rings, until it leaves."""

    rings: SwaRings
    slot: int

    def release(self, cache: Any) -> None:
        self.rings.release(self.slot, cache)


# ---- SGLang ------------------------------------------------------------------------------------


def _decode_call(layout: str) -> CallContract:
    module, within = mla_caller(layout)
    return CallContract(module, within, "flash_mla_with_kvcache_sm120", _MLA_KW, 0,
                        "the hook returns (out, None): only out may be used")

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
        calls={layout: (_decode_call(layout),) for layout in LAYOUTS},
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
    vllm=VllmDelivery(
        "hook", "FlashMLA's sparse FP8 decode entry (flash_mla_with_kvcache), imported by "
        "value into the V4 attention module", inert=vllm_attention.inert,
        variants=vllm_attention.VARIANTS,
        sites=vllm_targets.per_layout(vllm_targets.decode_sites),
        calls=vllm_targets.per_layout(vllm_targets.decode_calls)),
    doc=__doc__ or "",
    swaps=(
        Swap(Op.ATTENTION, split_k("bfloat16", "lse"), ("split-k", "batch-kv-slot",
                                                        "decode-rope-fp8", "compress-rope-base",
                                                        "swa-ring-stale")),
        Swap(Op.ATTENTION, split_k("float32", "lse"), ("split-k-fp32",)),
        Swap(Op.ATTENTION, split_k("bfloat16", "no-rescale"), ("merge-no-rescale",)),
        Swap(Op.KV_WRITE, _batch_kv_slot, ("batch-kv-slot",)),
        Swap(Op.KV_READ, _decode_rope_fp8, ("decode-rope-fp8",)),
        Swap(Op.COMPRESSED_ROPE, _compress_rope_base, ("compress-rope-base",)),
        Swap(Op.WINDOW_STORE, lambda site: SwaRings, ("swa-ring-stale",)),
    ),
    planners=Planners(sglang=attention.decode_plan, vllm=vllm_attention.plan),
)
