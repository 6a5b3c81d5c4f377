"""Sparse MQA attention with a per-head sink, exact or split-K over 64-key chunks (patch 3).

DeepSeek-V4 attention is MQA: all H query heads share one 512-dim head whose rows are both K and
V. Each query token t attends to its own compact key list `indices[t]` (row ids into a KV pool:
compressed entries, then window tokens; -1 = no key) plus a per-head sink logit, an extra
softmax term with no value that is dropped after the softmax.

`split=None` is the exact fp32 softmax. `split=64` is the numerics of SGLang's split-K ("MMA")
decode kernel: list positions [64s, 64s+64) form split s; each split keeps a partial output
rounded to `partial_dtype` (bf16 in the patch) and an fp32 log-sum-exp; the partials are merged
by LSE (`merge="lse"`) or, for the fault variant, by their local sums without rescaling to the
global max (`merge="no-rescale"`); the sink is applied after the merge and the output is rounded
to `partial_dtype` (the kernel writes bf16).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch

try:  # guarded: the references and every module import without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without Triton
    triton = tl = None

from ._triton import install_helpers, interpreter_active, next_pow2, require_triton


MERGES = ("lse", "no-rescale")
PARTIAL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BLOCK_BYTES = 64 << 20  # working-set budget of one query block in the reference


def check_attention_args(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor,
    split: int | None,
    partial_dtype: torch.dtype,
    merge: str,
) -> None:
    """Validate shapes and options shared by the reference and the Triton wrapper."""
    if q.dim() != 3:
        raise ValueError(f"q must be [T, H, D], got shape {tuple(q.shape)}")
    T, H, D = q.shape
    if kv.dim() != 2 or kv.shape[1] != D:
        raise ValueError(f"kv must be [N, {D}] (one shared K=V head), got {tuple(kv.shape)}")
    if indices.dim() != 2 or indices.shape[0] != T:
        raise ValueError(f"indices must be [{T}, K], got {tuple(indices.shape)}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be int32 or int64, got {indices.dtype}")
    if sink.shape != (H,):
        raise ValueError(f"sink must be [{H}] (one logit per head), got {tuple(sink.shape)}")
    if split is not None and (not isinstance(split, int) or split <= 0):
        raise ValueError(f"split must be None or a positive int, got {split!r}")
    if partial_dtype not in PARTIAL_DTYPES:
        raise ValueError(f"partial_dtype must be one of {PARTIAL_DTYPES}, got {partial_dtype}")
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    if merge != "lse" and split is None:
        raise ValueError("merge='no-rescale' merges split-K partials: it needs split=64")


def sparse_attention_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
    *,
    split: int | None = None,
    partial_dtype: torch.dtype = torch.float32,
    merge: str = "lse",
) -> torch.Tensor:
    """PyTorch reference: fp32, blocked over query tokens, batched matmuls.

    q: [T, H, D]; kv: [N, D] (K = V); indices: [T, K] (-1 = no key); sink: [H]. Returns
    [T, H, D] fp32. A query with no valid key returns 0 (only the sink is in its softmax).
    Within a block of queries, each chunk of list positions (a split, or the whole list) gathers
    the union of its kv rows once and works with GEMMs against it: prefill blocks share most of
    their rows, and a row gather per (query, key) costs far more on a CPU than the GEMM.
    """
    check_attention_args(q, kv, indices, sink, split, partial_dtype, merge)
    T, H, D = q.shape
    out = torch.zeros(T, H, D, dtype=torch.float32, device=q.device)
    if T == 0 or indices.shape[1] == 0:
        return out
    if int(indices.max()) >= kv.shape[0]:
        raise ValueError(f"indices reach row {int(indices.max())} but kv has {kv.shape[0]} rows")
    rows = _rows_per_block(H, indices.shape[1], kv.shape[0], split)
    qf, sinkf = q.float(), sink.float().to(q.device)
    for t0 in range(0, T, rows):
        idx = _trim(indices[t0 : t0 + rows].to(kv.device))
        if idx.shape[1] == 0:
            continue  # no query of this block has a key: output stays 0
        chunks = _chunks(kv, idx, split or idx.shape[1])
        s = _scores(qf[t0 : t0 + rows], chunks, scale)  # [Tb, H, Kb], -inf where no key
        if split is None:
            out[t0 : t0 + rows] = _exact(s, chunks, sinkf)
        else:
            o, lse, l_sum = _split_partials(s, chunks, split, partial_dtype)
            merged = _merge_partials(o, lse, l_sum, sinkf, merge)
            out[t0 : t0 + rows] = merged.to(partial_dtype).float()
    return out


def _rows_per_block(H: int, K: int, N: int, split: int | None) -> int:
    """Largest power-of-two block (<= 64 queries) whose working set fits the budget: scores
    and weights [Tb, H, K], and per chunk the union weights [Tb, H, U] with U <= Tb·chunk."""
    chunk = K if split is None else split
    rows = 64  # small blocks keep each union close to the shared rows (window rows are not)
    while rows > 1 and 4 * rows * H * (4 * K + min(N + 1, rows * chunk)) > _BLOCK_BYTES:
        rows //= 2
    return rows


def _trim(idx: torch.Tensor) -> torch.Tensor:
    """Cut trailing list positions that are -1 for every query of the block: lists are
    compact, so this bounds the work by the block's longest list. Cutting only at the end
    keeps every list position, hence every split boundary, where it was."""
    used = torch.nonzero((idx >= 0).any(0))
    return idx[:, : int(used[-1]) + 1 if used.numel() else 0]


def _chunks(
    kv: torch.Tensor, idx: torch.Tensor, chunk: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per chunk of list positions: (kv_u [U, D] fp32 = the chunk's distinct rows,
    pos [Tb, C] long = where each list entry sits in kv_u, valid [Tb, C] bool)."""
    out = []
    for c0 in range(0, idx.shape[1], chunk):
        ic = idx[:, c0 : c0 + chunk].long()
        uniq, pos = _distinct_rows(ic, kv.shape[0])  # -1 (if any) becomes one masked row
        out.append((kv.index_select(0, uniq.clamp(min=0)).float(), pos, ic >= 0))
    return out


def _distinct_rows(ic: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted distinct values of ic (row ids or -1) and the position of each entry among them.
    Marks in a [N + 1] table when the chunk is large against the pool (no sort), else unique."""
    if ic.numel() * 16 < n_rows:
        return torch.unique(ic, return_inverse=True)
    present = torch.zeros(n_rows + 1, dtype=torch.bool, device=ic.device)
    present[ic.reshape(-1) + 1] = True
    uniq = torch.nonzero(present)[:, 0] - 1
    slot = torch.cumsum(present, 0) - 1  # [N + 1]: row id + 1 -> its place in uniq
    return uniq, slot[ic + 1]


def _scores(qb: torch.Tensor, chunks: list, scale: float) -> torch.Tensor:
    """Logits scale·q·k for every list entry. qb: [Tb, H, D] -> [Tb, H, Kb], -inf = no key."""
    Tb, H, D = qb.shape
    parts = []
    for kv_u, pos, valid in chunks:
        dense = (qb.reshape(Tb * H, D) @ kv_u.T).view(Tb, H, -1)  # [Tb, H, U]
        s = dense.gather(2, pos[:, None, :].expand(Tb, H, pos.shape[1])) * scale
        parts.append(s.masked_fill_(~valid[:, None, :], float("-inf")))
    return torch.cat(parts, dim=2)


def _weighted_values(p: torch.Tensor, chunks: list) -> torch.Tensor:
    """Σ_j p[t, h, j]·kv[idx[t, j]] per chunk. p: [Tb, H, Kb] -> [Tb, H, n_chunks, D]."""
    Tb, H, _ = p.shape
    outs, c0 = [], 0
    for kv_u, pos, _valid in chunks:
        c = pos.shape[1]
        w = torch.zeros(Tb, H, kv_u.shape[0], dtype=p.dtype, device=p.device)
        w.scatter_add_(2, pos[:, None, :].expand(Tb, H, c), p[:, :, c0 : c0 + c])
        outs.append(w @ kv_u)  # [Tb, H, D]
        c0 += c
    return torch.stack(outs, dim=2)


def _exact(s: torch.Tensor, chunks: list, sink: torch.Tensor) -> torch.Tensor:
    """Exact fp32 softmax over (keys ∪ sink). s: [Tb, H, Kb] -> [Tb, H, D]."""
    m = torch.maximum(s.amax(-1), sink[None, :])  # [Tb, H]; the sink takes part in the max
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m[..., None])  # masked keys: exp(-inf) = 0
    den = p.sum(-1) + torch.exp(sink[None, :] - m)  # 0 only with no key and sink = -inf
    o = _weighted_values(p, chunks)[:, :, 0]
    return o / torch.where(den > 0, den, 1.0)[..., None]


def _split_partials(
    s: torch.Tensor, chunks: list, split: int, partial_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-split partials. s: [Tb, H, Kb]. Returns o [Tb, H, S, D] (values of partial_dtype,
    as fp32), lse [Tb, H, S] fp32 (-inf for an empty split), local sums l [Tb, H, S]."""
    Tb, H, kb = s.shape
    S = len(chunks)
    s = torch.nn.functional.pad(s, (0, S * split - kb), value=float("-inf"))
    s = s.view(Tb, H, S, split)
    m = s.amax(-1)  # [Tb, H, S]; -inf for an empty split
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m[..., None])
    l_sum = e.sum(-1)
    o = _weighted_values(e.view(Tb, H, S * split)[:, :, :kb], chunks)  # [Tb, H, S, D]
    nonempty = l_sum > 0
    o = torch.where(nonempty[..., None], o / torch.where(nonempty, l_sum, 1.0)[..., None], 0.0)
    o = o.to(partial_dtype).float()
    lse = torch.where(nonempty, m + torch.log(l_sum), float("-inf"))
    return o, lse, l_sum


def _merge_partials(
    o: torch.Tensor, lse: torch.Tensor, l_sum: torch.Tensor, sink: torch.Tensor, merge: str
) -> torch.Tensor:
    """Merge split partials in fp32 and apply the sink. o: [Tb, H, S, D] -> [Tb, H, D].

    Weights are normalised before the sum (a_s = w_s / Σ w), so with one non-empty split the
    weight is exactly 1 and both merges return that split's partial bit for bit.
    """
    big_m = lse.amax(-1)  # [Tb, H]
    big_m = torch.where(torch.isfinite(big_m), big_m, torch.zeros_like(big_m))
    w_lse = torch.exp(lse - big_m[..., None])  # [Tb, H, S]; empty split: 0
    tot = w_lse.sum(-1)
    lse_all = torch.where(tot > 0, big_m + torch.log(tot), float("-inf"))  # [Tb, H]
    w = w_lse if merge == "lse" else l_sum  # the fault: local sums, no exp(m_s - M) factor
    den = w.sum(-1)
    a = w / torch.where(den > 0, den, 1.0)[..., None]
    out = (a[..., None] * o).sum(2)  # [Tb, H, D]
    # Sink after the merge: out *= exp(LSE - logaddexp(LSE, sink)); LSE = -inf gives 0.
    sink_b = sink[None, :].expand_as(lse_all)
    keep = torch.exp(lse_all - torch.logaddexp(lse_all, sink_b))
    keep = torch.where(torch.isfinite(lse_all), keep, 0.0)  # also sink = -inf with no key
    return out * keep[..., None]


# ----------------------------------------------------------------------------------------------
# SGLang's FP8 paged KV layout ("MODEL1", DeepSeek-V4): per token 448 FP8-E4M3 nope dims with one
# UE8M0 scale per 64 dims, then 64 bf16 rope dims. A page of P tokens holds P × 576 data bytes
# (token i at i·576: nope bytes, then rope), then P × 8 scale bytes (7 scales + 1 pad), and is
# padded to a multiple of 576 bytes. Row id r lives in page r // P at slot r % P.
# ----------------------------------------------------------------------------------------------
NOPE, ROPE, TOKEN_DATA, TOKEN_SCALES = 448, 64, 576, 8
MODEL1_PAGE_SIZES = {"swa": 256, "c4": 64, "c128": 2}  # page_size 256 ÷ compression ratio


def model1_page_bytes(page_size: int) -> int:
    return math.ceil(page_size * (TOKEN_DATA + TOKEN_SCALES) / TOKEN_DATA) * TOKEN_DATA


@dataclass(frozen=True)
class PagedKV:
    """One key source in the FP8 layout: cache [num_pages, page_bytes] uint8, the queries' key
    lists into it (indices [T, K] int32, row ids, -1 = none) and its page size."""

    cache: torch.Tensor
    indices: torch.Tensor
    page_size: int


def model1_pack(kv: torch.Tensor, page_size: int) -> torch.Tensor:
    """Quantize rows kv [N, 512] into MODEL1 pages -> uint8 [ceil(N / P), page_bytes].
    Scale per 64 nope dims = the power of two at or above amax / 448 (UE8M0, as SGLang)."""
    if kv.dim() != 2 or kv.shape[1] != NOPE + ROPE:
        raise ValueError(f"MODEL1 rows are [N, {NOPE + ROPE}], got {tuple(kv.shape)}")
    N = kv.shape[0]
    pages = max(1, math.ceil(N / page_size))
    nope = kv[:, :NOPE].float().view(N, NOPE // 64, 64)
    amax = nope.abs().amax(-1).clamp_min(2.0**-100)
    exp = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
    codes = (nope / torch.exp2(exp)[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    data = torch.zeros(pages * page_size, TOKEN_DATA, dtype=torch.uint8, device=kv.device)
    data[:N, :NOPE] = codes.view(N, NOPE)
    data[:N, NOPE:] = kv[:, NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    scales = torch.zeros(pages * page_size, TOKEN_SCALES, dtype=torch.uint8, device=kv.device)
    scales[:N, : NOPE // 64] = (exp + 127).to(torch.uint8)
    out = torch.zeros(pages, model1_page_bytes(page_size), dtype=torch.uint8, device=kv.device)
    out[:, : page_size * TOKEN_DATA] = data.view(pages, -1)
    scale_at = page_size * TOKEN_DATA
    out[:, scale_at : scale_at + page_size * TOKEN_SCALES] = scales.view(pages, -1)
    return out


def model1_unpack(cache: torch.Tensor, page_size: int, rows: torch.Tensor) -> torch.Tensor:
    """Dequantize rows (long ids >= 0) of a MODEL1 cache -> [len(rows), 512] fp32 (bf16 values:
    fp8 × a power of two and bf16 rope are exact in bf16)."""
    page, slot = rows // page_size, rows % page_size
    flat = cache.view(cache.shape[0], -1)
    cols = torch.arange(TOKEN_DATA, device=rows.device)
    data = flat[page[:, None], slot[:, None] * TOKEN_DATA + cols]
    sc = flat[page[:, None], page_size * TOKEN_DATA + slot[:, None] * TOKEN_SCALES
              + torch.arange(NOPE // 64, device=rows.device)]
    nope = data[:, :NOPE].contiguous().view(torch.float8_e4m3fn).float().view(-1, NOPE // 64, 64)
    nope = nope * torch.exp2(sc.float() - 127.0)[..., None]
    rope = data[:, NOPE:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope.view(-1, NOPE), rope], dim=1)


def sparse_attention_fp8_ref(
    q: torch.Tensor,
    sources: Sequence[PagedKV],
    sink: torch.Tensor,
    scale: float,
    *,
    split: int | None = None,
    partial_dtype: torch.dtype = torch.float32,
    merge: str = "lse",
) -> torch.Tensor:
    """Reference for the FP8 paged layout: dequantize the referenced rows, then
    `sparse_attention_ref` over the sources' lists one after the other, each list padded to a
    whole number of splits (splits never straddle two sources, as in SGLang's split-K)."""
    rows_all, lists, base = [], [], 0
    for src in sources:
        idx = src.indices.long()
        rows = torch.unique(idx[idx >= 0])
        rows_all.append(model1_unpack(src.cache, src.page_size, rows))
        pos = torch.searchsorted(rows, idx.clamp(min=0)) + base
        lst = torch.where(idx >= 0, pos, -1)
        if split:
            lst = torch.nn.functional.pad(lst, (0, -lst.shape[1] % split), value=-1)
        lists.append(lst)
        base += rows.numel()
    kv = torch.cat(rows_all) if base else torch.zeros(1, NOPE + ROPE, device=q.device)
    return sparse_attention_ref(q, kv, torch.cat(lists, dim=1), sink, scale, split=split,
                                partial_dtype=partial_dtype, merge=merge)


# ----------------------------------------------------------------------------------------------
# Triton. Split-K "MMA" kernel: grid (query tokens, splits, head blocks); heads are tl.dot's M
# dimension; a split = TILES tiles of TILE_N list positions with an online softmax inside;
# partial out (bf16 or fp32) + fp32 LSE per split to scratch; a merge kernel combines them and
# applies the sink. Rows have two parts: A (dims [0, A_DIM): the whole row in the dense layout,
# the FP8 nope dims in MODEL1) and B (MODEL1's bf16 rope dims; none in the dense layout, where
# HAS_B is off and its 16-wide tile is fully masked).
# ----------------------------------------------------------------------------------------------
TRITON_TILES = (16, 32, 64)  # tl.dot needs N >= 16; splits are whole multiples of a tile
_SCRATCH_BYTES = 512 << 20  # bound on the partials buffer: queries are launched in blocks
round_bf16 = None  # a jitted helper, bound by install_helpers() when the kernels are built


@functools.cache
def _kernels(interpret: bool) -> SimpleNamespace:
    """Build the jitted kernels once per mode (see `_triton.jit_helpers`)."""
    install_helpers(globals(), interpret)
    globals()["_load_rows"] = triton.jit(_load_rows_py)

    @triton.jit
    def split_partials(
        q_ptr, kv_ptr, idx_ptr, o_ptr, lse_ptr, lsum_ptr,
        H, K, S_total, s_offset, scale, stride_qt, stride_qh, stride_kv, stride_it, TILES,
        D: tl.constexpr, A_DIM: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
        HAS_B: tl.constexpr, FP8: tl.constexpr, PAGE: tl.constexpr, PAGE_BYTES: tl.constexpr,
        TILE_N: tl.constexpr, BLOCK_H: tl.constexpr,
        OP_DTYPE: tl.constexpr, ROUND_OPS: tl.constexpr, ROUND_PARTIAL: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        s = tl.program_id(1)
        offs_h = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
        hmask = offs_h < H
        offs_a = tl.arange(0, BLOCK_A)
        offs_b = A_DIM + tl.arange(0, BLOCK_B)
        q_rows = q_ptr + t * stride_qt + offs_h[:, None] * stride_qh
        qa = tl.load(q_rows + offs_a[None, :], mask=hmask[:, None] & (offs_a < A_DIM)[None, :],
                     other=0.0).to(tl.float32)
        qb = tl.load(q_rows + offs_b[None, :], mask=hmask[:, None] & (offs_b < D)[None, :],
                     other=0.0).to(tl.float32)
        if ROUND_OPS:  # bf16 operands: q is rounded as the kv rows already are
            qa = round_bf16(qa)
            qb = round_bf16(qb)
        qa = qa.to(OP_DTYPE)
        qb = qb.to(OP_DTYPE)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc_a = tl.zeros([BLOCK_H, BLOCK_A], tl.float32)
        acc_b = tl.zeros([BLOCK_H, BLOCK_B], tl.float32)
        for j in range(TILES):
            offs_n = (s * TILES + j) * TILE_N + tl.arange(0, TILE_N)
            idx = tl.load(idx_ptr + t * stride_it + offs_n, mask=offs_n < K, other=-1).to(tl.int64)
            valid = idx >= 0
            ka, kb = _load_rows(kv_ptr, idx, valid, stride_kv, offs_a, offs_b, A_DIM, D,
                                FP8, PAGE, PAGE_BYTES)
            ka = ka.to(OP_DTYPE)
            kb = kb.to(OP_DTYPE)
            x = tl.dot(qa, tl.trans(ka), input_precision="ieee")
            if HAS_B:
                x += tl.dot(qb, tl.trans(kb), input_precision="ieee")
            x = tl.where(valid[None, :], x * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(x, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_use)  # 0 on the first tile
            p = tl.exp(x - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if ROUND_OPS:
                p = round_bf16(p)
            acc_a = acc_a * alpha[:, None] + tl.dot(p.to(OP_DTYPE), ka, input_precision="ieee")
            if HAS_B:
                acc_b = acc_b * alpha[:, None] + tl.dot(p.to(OP_DTYPE), kb, input_precision="ieee")
            m_i = m_new
        l_div = tl.where(l_i > 0, l_i, 1.0)
        oa = tl.math.div_rn(acc_a, tl.broadcast_to(l_div[:, None], acc_a.shape))
        ob = tl.math.div_rn(acc_b, tl.broadcast_to(l_div[:, None], acc_b.shape))
        if ROUND_PARTIAL:
            oa = round_bf16(oa)
            ob = round_bf16(ob)
        row = (t * S_total + s_offset + s) * H + offs_h  # rows of the [T, S_total, H] scratch
        tl.store(o_ptr + row[:, None] * D + offs_a[None, :], oa,
                 mask=hmask[:, None] & (offs_a < A_DIM)[None, :])
        tl.store(o_ptr + row[:, None] * D + offs_b[None, :], ob,
                 mask=hmask[:, None] & (offs_b < D)[None, :])
        m_i = tl.where(m_i == float("-inf"), 0.0, m_i)
        tl.store(lse_ptr + row, tl.where(l_i > 0, m_i + tl.log(l_div), float("-inf")), mask=hmask)
        tl.store(lsum_ptr + row, l_i, mask=hmask)

    @triton.jit
    def baseline_partial(
        q_ptr, kv_ptr, idx_ptr, o_ptr, lse_ptr, lsum_ptr,
        H, K, S_total, s_offset, scale, stride_qt, stride_qh, stride_kv, stride_it,
        D: tl.constexpr, A_DIM: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
        HAS_B: tl.constexpr, FP8: tl.constexpr, PAGE: tl.constexpr, PAGE_BYTES: tl.constexpr,
        BLOCK_T: tl.constexpr, ROUND_PARTIAL: tl.constexpr,
    ):
        # SGLang's stock SM120 style: one program per (token, head), BLOCK_T keys at a time,
        # logits by vector multiply + reduce (no tl.dot), fp32 online softmax, no split-K.
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        offs_a = tl.arange(0, BLOCK_A)
        offs_b = A_DIM + tl.arange(0, BLOCK_B)
        qa = tl.load(q_ptr + t * stride_qt + h * stride_qh + offs_a, mask=offs_a < A_DIM,
                     other=0.0).to(tl.float32)
        qb = tl.load(q_ptr + t * stride_qt + h * stride_qh + offs_b, mask=offs_b < D,
                     other=0.0).to(tl.float32)
        m_i = tl.full([], float("-inf"), tl.float32)
        l_i = tl.full([], 0.0, tl.float32)
        acc_a = tl.zeros([BLOCK_A], tl.float32)
        acc_b = tl.zeros([BLOCK_B], tl.float32)
        for n0 in range(0, K, BLOCK_T):
            offs_n = n0 + tl.arange(0, BLOCK_T)
            idx = tl.load(idx_ptr + t * stride_it + offs_n, mask=offs_n < K, other=-1).to(tl.int64)
            valid = idx >= 0
            ka, kb = _load_rows(kv_ptr, idx, valid, stride_kv, offs_a, offs_b, A_DIM, D,
                                FP8, PAGE, PAGE_BYTES)
            x = tl.sum(ka * qa[None, :], 1)
            if HAS_B:
                x += tl.sum(kb * qb[None, :], 1)
            x = tl.where(valid, x * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(x, 0))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_use)
            p = tl.exp(x - m_use)
            l_i = l_i * alpha + tl.sum(p, 0)
            acc_a = acc_a * alpha + tl.sum(p[:, None] * ka, 0)
            if HAS_B:
                acc_b = acc_b * alpha + tl.sum(p[:, None] * kb, 0)
            m_i = m_new
        l_div = tl.where(l_i > 0, l_i, 1.0)
        oa = acc_a / l_div
        ob = acc_b / l_div
        if ROUND_PARTIAL:
            oa = round_bf16(oa)
            ob = round_bf16(ob)
        row = (t * S_total + s_offset) * H + h
        tl.store(o_ptr + row * D + offs_a, oa, mask=offs_a < A_DIM)
        tl.store(o_ptr + row * D + offs_b, ob, mask=offs_b < D)
        m_i = tl.where(m_i == float("-inf"), 0.0, m_i)
        tl.store(lse_ptr + row, tl.where(l_i > 0, m_i + tl.log(l_div), float("-inf")))
        tl.store(lsum_ptr + row, l_i)

    @triton.jit
    def merge_partials(
        o_ptr, lse_ptr, lsum_ptr, sink_ptr, out_ptr,
        H, D, S, stride_ot, stride_oh,
        NO_RESCALE: tl.constexpr, ROUND_OUT: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        # program (t, d-chunk, head block): merge the S partials of query t, then the sink.
        t = tl.program_id(0).to(tl.int64)
        offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        offs_h = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
        hmask = offs_h < H
        dmask = offs_d < D
        big_m = tl.full([BLOCK_H], float("-inf"), tl.float32)
        for s in range(S):
            lse = tl.load(lse_ptr + (t * S + s) * H + offs_h, mask=hmask, other=float("-inf"))
            big_m = tl.maximum(big_m, lse)
        big_m = tl.where(big_m == float("-inf"), 0.0, big_m)
        tot = tl.zeros([BLOCK_H], tl.float32)
        den = tl.zeros([BLOCK_H], tl.float32)
        for s in range(S):
            lse = tl.load(lse_ptr + (t * S + s) * H + offs_h, mask=hmask, other=float("-inf"))
            w = tl.exp(lse - big_m)
            tot += w
            if NO_RESCALE:  # the fault: local sums, no exp(m_s - M) factor
                w = tl.load(lsum_ptr + (t * S + s) * H + offs_h, mask=hmask, other=0.0)
            den += w
        den = tl.where(den > 0, den, 1.0)
        acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
        for s in range(S):  # Σ_s (w_s / Σ w)·o_s: a lone split gets weight 1 exactly
            row = (t * S + s) * H + offs_h
            if NO_RESCALE:
                w = tl.load(lsum_ptr + row, mask=hmask, other=0.0)
            else:
                w = tl.exp(tl.load(lse_ptr + row, mask=hmask, other=float("-inf")) - big_m)
            o = tl.load(o_ptr + row[:, None] * D + offs_d[None, :],
                        mask=hmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            acc += tl.math.div_rn(w, den)[:, None] * o
        # sink: out *= exp(LSE - logaddexp(LSE, sink)), LSE = M + log Σ exp(lse_s - M)
        lse_all = tl.where(tot > 0, big_m + tl.log(tl.where(tot > 0, tot, 1.0)), float("-inf"))
        sink = tl.load(sink_ptr + offs_h, mask=hmask, other=0.0).to(tl.float32)
        top = tl.maximum(lse_all, sink)
        top = tl.where(top == float("-inf"), 0.0, top)
        lae = top + tl.log(tl.exp(lse_all - top) + tl.exp(sink - top))
        keep = tl.where(lse_all > float("-inf"), tl.exp(lse_all - lae), 0.0)
        out = acc * keep[:, None]
        if ROUND_OUT:
            out = round_bf16(out)
        tl.store(out_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :], out,
                 mask=hmask[:, None] & dmask[None, :])

    return SimpleNamespace(split_partials=split_partials, baseline_partial=baseline_partial,
                           merge_partials=merge_partials)


def _load_rows_py(kv_ptr, idx, valid, stride_kv, offs_a, offs_b, A_DIM, D, FP8, PAGE,
                  PAGE_BYTES):
    """Device function (jitted in `_kernels`): load key rows `idx` as fp32 part A [n, BLOCK_A]
    and part B [n, BLOCK_B]; 0 where invalid or past the part's dims."""
    ma = valid[:, None] & (offs_a < A_DIM)[None, :]
    mb = valid[:, None] & (offs_b < D)[None, :]
    if FP8:  # MODEL1 page addressing; nope = fp8 × 2^(ue8m0 - 127) per 64 dims, rope = bf16
        page = tl.where(valid, idx, 0) // PAGE
        slot = tl.where(valid, idx, 0) % PAGE
        data = kv_ptr + page * PAGE_BYTES + slot * 576
        raw = tl.load(data[:, None] + offs_a[None, :], mask=ma, other=0)
        sc = tl.load(kv_ptr + page[:, None] * PAGE_BYTES + PAGE * 576 + slot[:, None] * 8
                     + offs_a[None, :] // 64, mask=ma, other=127)
        pow2 = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        ka = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * pow2
        rope = (data + 448).to(tl.pointer_type(tl.bfloat16))
        kb = tl.load(rope[:, None] + (offs_b - A_DIM)[None, :], mask=mb, other=0.0)
    else:
        rows = kv_ptr + idx[:, None] * stride_kv
        ka = tl.load(rows + offs_a[None, :], mask=ma, other=0.0)
        kb = tl.load(rows + offs_b[None, :], mask=mb, other=0.0)
    return ka.to(tl.float32), kb.to(tl.float32)


_load_rows = None  # bound to triton.jit(_load_rows_py) when the kernels are built


@dataclass(frozen=True)
class AttnConfig:
    """Launch configuration of the split-K kernel (None = the built-in choice for the shape).
    tile_n: keys per tile (16/32/64); tiles: tiles per split on the exact path (a patch split
    fixes its own: split / tile_n)."""

    tile_n: int | None = None
    block_h: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    tiles: int | None = None


@dataclass(frozen=True)
class _Source:
    """One key source as the kernels see it."""

    data: torch.Tensor  # dense kv [N, D] or a MODEL1 cache [pages, page_bytes] uint8
    indices: torch.Tensor  # [T, K]
    fp8: bool
    page: int = 1
    page_bytes: int = 0


def _alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Scratch allocation (a seam for tests, which poison scratch with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _max_tile(D: int, device: torch.device) -> int:
    """Keys per tile: 64, or 32 for 512-dim rows on GPUs with ~100 KB of shared memory per
    block (SM86/89/120: a 64×512 bf16 key tile in two operand layouts needs 128 KB)."""
    if D < 256 or device.type != "cuda":
        return 64
    return 32 if torch.cuda.get_device_capability(device) in {(8, 6), (8, 7), (8, 9), (12, 0),
                                                               (12, 1)} else 64


def _plan_tiles(split: int | None, srcs: list[_Source], T: int, hblocks: int,
                max_tile: int) -> tuple[int, int]:
    """(TILE_N, TILES). A patch split is TILES tiles of TILE_N keys. The exact path
    (split=None, fp32 partials) picks TILES so that the grid has ~2 programs per SM of an H200
    without producing many more partials than needed."""
    if split is not None:
        tile = min(split, max_tile)
        return tile, split // tile
    n_tiles = max(math.ceil(s.indices.shape[1] / max_tile) for s in srcs)
    want_splits = max(1, math.ceil(264 / max(1, T * hblocks)))
    return max_tile, max(1, math.ceil(n_tiles / want_splits))


def _launch(q, srcs, sink, scale, *, split, pdt, merge, out, baseline,
            config: AttnConfig | None = None) -> torch.Tensor:
    """Run split (or baseline) partials for every source, then the merge, into out [T, H, D]."""
    cfg = config or AttnConfig()
    T, H, D = q.shape
    if out is None:
        out = torch.empty(T, H, D, dtype=torch.float32, device=q.device)
    elif out.shape != (T, H, D) or out.dtype != torch.float32 or out.stride(-1) != 1:
        raise ValueError(f"out must be a [{T}, {H}, {D}] fp32 tensor with unit last stride")
    if T == 0:
        return out
    interp = interpreter_active()
    ks = _kernels(interp)
    install_helpers(globals(), interp)
    q = q if q.stride(-1) == 1 else q.contiguous()
    sink = sink.contiguous()
    fp8 = srcs[0].fp8
    a_dim, b_dim = (NOPE, ROPE) if fp8 else (D, 0)
    low = fp8 or srcs[0].data.dtype in (torch.bfloat16, torch.float16)
    block_h = cfg.block_h or min(max(16, next_pow2(H)), 32 if D >= 256 else 64)
    hblocks = math.ceil(H / block_h)
    tile, tiles = _plan_tiles(split, srcs, T, hblocks, cfg.tile_n or _max_tile(D, q.device))
    if split is None and cfg.tiles:
        tiles = cfg.tiles
    # wide rows: 8 warps hold the [block_h, 512] fp32 accumulator in registers; one pipeline
    # stage, as the key tile (64 or 32 keys × 512 bf16) already fills most shared memory
    launch = dict(num_warps=cfg.num_warps or (8 if D >= 256 else 4),
                  num_stages=cfg.num_stages or (1 if D >= 256 else 2))
    n_split = [1 if baseline else max(1, math.ceil(s.indices.shape[1] / (tile * tiles)))
               for s in srcs]
    S = sum(n_split)
    consts = dict(D=D, A_DIM=a_dim, BLOCK_A=max(16, next_pow2(a_dim)), BLOCK_B=max(16, b_dim),
                  HAS_B=b_dim > 0, FP8=fp8)
    rows = max(1, min(T, _SCRATCH_BYTES // (S * H * (D * pdt.itemsize + 8))))
    for t0 in range(0, T, rows):
        tb = min(rows, T - t0)
        o = _alloc((tb, S, H, D), pdt, q.device)
        lse = _alloc((tb, S, H), torch.float32, q.device)
        lsum = _alloc((tb, S, H), torch.float32, q.device)
        s_off = 0
        for src, ns in zip(srcs, n_split):
            idx = src.indices[t0 : t0 + tb]
            idx = idx if idx.stride(-1) == 1 else idx.contiguous()
            args = (q[t0:], src.data, idx, o, lse, lsum, H, idx.shape[1], S, s_off, float(scale),
                    q.stride(0), q.stride(1), src.data.stride(0), idx.stride(0))
            geo = dict(consts, PAGE=src.page, PAGE_BYTES=src.page_bytes)
            if baseline:
                ks.baseline_partial[(tb, H)](*args, **geo, BLOCK_T=16,
                                             ROUND_PARTIAL=pdt == torch.bfloat16)
            else:
                ks.split_partials[(tb, ns, hblocks)](
                    *args, tiles, **geo, TILE_N=tile, BLOCK_H=block_h,
                    OP_DTYPE=tl.bfloat16 if low and not interp else tl.float32, ROUND_OPS=low,
                    ROUND_PARTIAL=pdt == torch.bfloat16, **launch)
            s_off += ns
        ks.merge_partials[(tb, math.ceil(D / 64), hblocks)](
            o, lse, lsum, sink, out[t0:], H, D, S, out.stride(0), out.stride(1),
            NO_RESCALE=merge == "no-rescale", ROUND_OUT=pdt == torch.bfloat16,
            BLOCK_H=block_h, BLOCK_D=64)
    return out


def _check_triton_split(split: int | None, partial_dtype: torch.dtype) -> None:
    if split is not None and not (split in TRITON_TILES or split % 64 == 0):
        raise ValueError(f"the Triton kernel needs split in {TRITON_TILES} or a multiple of 64, "
                         f"got {split}")
    if partial_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"the Triton kernel keeps partials in fp32 or bf16, got {partial_dtype}")


def sparse_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
    *,
    split: int | None = None,
    partial_dtype: torch.dtype = torch.float32,
    merge: str = "lse",
    out: torch.Tensor | None = None,
    config: AttnConfig | None = None,
) -> torch.Tensor:
    """Triton split-K attention, same contract as `sparse_attention_ref` (CUDA tensors, or CPU
    tensors under TRITON_INTERPRET=1). `split=None` is exact: fp32 partials over splits sized
    for the GPU, LSE merge, no bf16 rounding (the exact softmax up to fp32 rounding).

    Operands: with fp32 kv the dots are fp32 (IEEE); with bf16/fp16 kv, q and the softmax
    weights are rounded to bf16 and the dots use bf16 tensor cores with fp32 accumulation.
    `out` (optional, [T, H, D] fp32) receives the result; `config` overrides the launch.
    """
    check_attention_args(q, kv, indices, sink, split, partial_dtype, merge)
    _check_triton_split(split, partial_dtype)
    require_triton(q, kv, indices, sink)
    src = _Source(kv if kv.stride(-1) == 1 else kv.contiguous(), indices, fp8=False)
    pdt = torch.float32 if split is None else partial_dtype
    return _launch(q, [src], sink, scale, split=split, pdt=pdt, merge=merge, out=out,
                   baseline=False, config=config)


def _fp8_sources(q: torch.Tensor, sources: Sequence[PagedKV]) -> list[_Source]:
    if q.dim() != 3 or q.shape[2] != NOPE + ROPE:
        raise ValueError(f"q must be [T, H, {NOPE + ROPE}] for the MODEL1 layout")
    out = []
    for s in sources:
        if s.cache.dtype != torch.uint8 or s.cache.dim() != 2:
            raise ValueError("a MODEL1 cache is a [pages, page_bytes] uint8 tensor")
        if s.page_size & (s.page_size - 1) or s.cache.shape[1] != model1_page_bytes(s.page_size):
            raise ValueError(f"page size {s.page_size} does not match the cache's page bytes")
        if s.indices.shape[0] != q.shape[0]:
            raise ValueError(f"indices must be [{q.shape[0]}, K], got {tuple(s.indices.shape)}")
        out.append(_Source(s.cache, s.indices, True, s.page_size, s.cache.stride(0)))
    if not out:
        raise ValueError("at least one key source is needed")
    return out


def sparse_attention_fp8(
    q: torch.Tensor,
    sources: Sequence[PagedKV],
    sink: torch.Tensor,
    scale: float,
    *,
    split: int | None = None,
    partial_dtype: torch.dtype = torch.float32,
    merge: str = "lse",
    out: torch.Tensor | None = None,
    config: AttnConfig | None = None,
) -> torch.Tensor:
    """Triton split-K attention over SGLang's FP8 MODEL1 pages (same numbers as
    `sparse_attention_fp8_ref`): one launch per source (e.g. SWA pages of 256 + C4 pages of
    64), each source's list split on its own, one merge over all splits."""
    _check_triton_split(split, partial_dtype)
    srcs = _fp8_sources(q, sources)
    require_triton(q, sink, *(s.data for s in srcs))
    pdt = torch.float32 if split is None else partial_dtype
    return _launch(q, srcs, sink, scale, split=split, pdt=pdt, merge=merge, out=out,
                   baseline=False, config=config)


def sparse_attention_baseline(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor, scale: float,
    *, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Non-MMA baseline in the style of SGLang's stock SM120 decode kernel: one program per
    (token, head), vector multiply-reduce, fp32 online softmax, no split-K; bf16 output."""
    check_attention_args(q, kv, indices, sink, None, torch.float32, "lse")
    require_triton(q, kv, indices, sink)
    src = _Source(kv if kv.stride(-1) == 1 else kv.contiguous(), indices, fp8=False)
    return _launch(q, [src], sink, scale, split=None, pdt=torch.bfloat16, merge="lse", out=out,
                   baseline=True)


def sparse_attention_fp8_baseline(
    q: torch.Tensor, sources: Sequence[PagedKV], sink: torch.Tensor, scale: float,
    *, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The non-MMA baseline over MODEL1 pages: one pass per source, partials (bf16) merged by
    LSE with the sink, as SGLang's stock kernel merges its SWA and compressed parts."""
    srcs = _fp8_sources(q, sources)
    require_triton(q, sink, *(s.data for s in srcs))
    return _launch(q, srcs, sink, scale, split=None, pdt=torch.bfloat16, merge="lse", out=out,
                   baseline=True)
