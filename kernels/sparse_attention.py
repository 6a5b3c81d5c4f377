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

`sparse_attention_segmented_ref` cuts each query's list where FlashMLA's split-KV schedule cuts it
(`precision: deployment`, stock attention: `reference/dispatch.py`), fp32 partials merged by LSE;
reference only (the engine calls it on every device when a row is cut).
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


def sparse_attention_segmented_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
    segments: torch.Tensor,
) -> torch.Tensor:
    """`sparse_attention_ref` with each query's list cut into given pieces, as FlashMLA's split-KV
    schedule cuts a row (`reference.dispatch.flashmla_split_points`): per piece an fp32 partial
    softmax, the pieces merged by their LSE in fp32 with the sink after the merge (FlashMLA's
    combine kernel). The queries in one piece go through `sparse_attention_ref` together.

    segments: [T, K] int, the piece of each list position (0, 1, ...; ignored where indices is
    -1), non-decreasing along a row. Returns [T, H, D] fp32."""
    check_attention_args(q, kv, indices, sink, None, torch.float32, "lse")
    if segments.shape != indices.shape:
        raise ValueError(f"segments must be {tuple(indices.shape)}, got {tuple(segments.shape)}")
    valid = indices >= 0
    pieces = torch.where(valid, segments.to(indices.device).long(), 0).amax(1)  # [T] last piece
    split_rows = torch.nonzero(pieces > 0)[:, 0]
    whole = torch.nonzero(pieces == 0)[:, 0]
    if split_rows.numel() == 0:
        return sparse_attention_ref(q, kv, indices, sink, scale)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    if whole.numel():  # the rows in one piece, as the unsplit kernel computes them
        out[whole] = sparse_attention_ref(q[whole], kv, indices[whole], sink, scale)
    qf, sinkf = q.float(), sink.float().to(q.device)
    S = int(pieces.max()) + 1
    rows = _rows_per_block(q.shape[1], indices.shape[1], kv.shape[0], None)
    for r0 in range(0, split_rows.numel(), rows):
        sel = split_rows[r0 : r0 + rows]
        idx = _trim(indices[sel].to(kv.device))
        seg = segments[sel][:, : idx.shape[1]].to(kv.device).long()
        chunks = _chunks(kv, idx, idx.shape[1])
        s = _scores(qf[sel], chunks, scale)  # [Tb, H, Kb], -inf where no key
        o, lse, l_sum = [], [], []
        for piece in range(S):  # one partial softmax per piece, fp32
            sp = s.masked_fill(~(seg == piece)[:, None, :], float("-inf"))
            m = sp.amax(-1)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(sp - m[..., None])
            tot = e.sum(-1)
            part = _weighted_values(e, chunks)[:, :, 0]
            ok = tot > 0
            o.append(torch.where(ok[..., None], part / torch.where(ok, tot, 1.0)[..., None], 0.0))
            lse.append(torch.where(ok, m + torch.log(tot), float("-inf")))
            l_sum.append(tot)
        out[sel] = _merge_partials(torch.stack(o, 2), torch.stack(lse, 2), torch.stack(l_sum, 2),
                                   sinkf, "lse")
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
# Triton. Split-K "MMA" kernel: a program owns (head block, query token, run of units), where a
# unit is one patch split (SPLIT_TILES tiles of TILE_N list positions) or, on the exact path,
# one tile. Heads are tl.dot's M dimension (64 heads = one wgmma warp group on sm_90); rows are
# read in CHUNK-column pieces (4 × 128 for 512 dims) that serve both dots, so a [64, 512] fp32
# accumulator is 4 register tensors and the K=V tile is one shared-memory buffer per stage.
# Patch numerics (SPLIT_TILES ≥ 1): each split's partial is rounded (bf16) and merged by LSE in
# registers (online, fp32), so per-split partials never touch device memory; a program writes one
# fp32 partial for its whole run, and a small merge kernel combines the runs (S_prog of them) and
# applies the sink. With one run per token (S_prog = 1) the split kernel finishes the token itself.
# ----------------------------------------------------------------------------------------------
TRITON_TILES = (16, 32, 64)  # tl.dot needs N >= 16; splits are whole multiples of a tile
_SCRATCH_BYTES = 512 << 20  # bound on the partials buffer: queries are launched in blocks
_MAX_GRID_Y = 65535
round_bf16 = None  # a jitted helper, bound by install_helpers() when the kernels are built
# device helpers, bound to triton.jit(<name>_py) in _kernels (see _DEVICE_HELPERS)
_k_ids = _k_chunk = _k_scores = _k_pv = _k_op = _k_exact_run = _k_close = _k_fold = None
_k_patch_run = _k_finish = None


def _k_op_py(x, ROUND_OPS: tl.constexpr, OP_DTYPE: tl.constexpr):
    """A dot operand: bf16 on the GPU (the cast rounds to nearest even); under the interpreter
    fp32 holding the bf16-rounded value (ROUND_OPS), as its bf16 dots are unusable."""
    if ROUND_OPS:
        x = round_bf16(x.to(tl.float32))
    return x.to(OP_DTYPE)


def _k_ids_py(u, jj, N0, id0, K0, id1, K1, TILE_N: tl.constexpr, ST: tl.constexpr,
              TWO: tl.constexpr):
    """Row ids of tile jj of unit u of the token's concatenated list (source 0's N0 units,
    then source 1's) -> [TILE_N] int32, -1 past the source's list. id1 is source 1's list as
    an element offset from id0 (a select between two pointers would lose their alignment)."""
    if TWO:
        first = u < N0
        offs = (tl.where(first, u, u - N0) * ST + jj) * TILE_N + tl.arange(0, TILE_N)
        ids = tl.load(id0 + tl.where(first, 0, id1) + offs,
                      mask=offs < tl.where(first, K0, K1), other=-1)
    else:
        offs = (u * ST + jj) * TILE_N + tl.arange(0, TILE_N)
        ids = tl.load(id0 + offs, mask=offs < K0, other=-1)
    return ids


def _k_chunk_py(kv_ptr, idx, valid, skv, psh, pby, c: tl.constexpr, CHUNK: tl.constexpr,
                D: tl.constexpr, A_DIM: tl.constexpr, FP8: tl.constexpr,
                ROUND_OPS: tl.constexpr, OP_DTYPE: tl.constexpr):
    """Columns [c·CHUNK, (c+1)·CHUNK) of key rows `idx` -> [n, CHUNK] dot operand, 0 where the
    key is invalid or past D. Dense rows: kv_ptr + idx·skv. MODEL1 (FP8, CHUNK = 128): pages of
    2^psh tokens and pby bytes; nope = e4m3 × 2^(ue8m0 − 127) per 64 dims, and the 64 bf16 rope
    dims fill the second half of the last chunk (dims 448..511)."""
    cols = c * CHUNK + tl.arange(0, CHUNK)
    if FP8:
        r = tl.where(valid, idx, 0)
        page = r >> psh
        slot = r & ((1 << psh) - 1)
        data = kv_ptr + page * pby + slot * 576  # [n] uint8 pointers: the token's row
        raw = tl.load(data[:, None] + cols[None, :],
                      mask=valid[:, None] & (cols < A_DIM)[None, :], other=0)
        # the row's 8 scale bytes as one int64 (a single 8-byte copy, pipelined like the
        # data); byte g = the UE8M0 exponent of dims [64g, 64g + 64)
        sc = (kv_ptr + page * pby + (576 << psh) + slot * 8).to(tl.pointer_type(tl.int64))
        e8 = tl.load(sc, mask=valid, other=0x7F7F7F7F7F7F7F7F)
        e_lo = ((e8 >> (16 * c)) & 0xFF).to(tl.int32)
        e_hi = ((e8 >> (16 * c + 8)) & 0xFF).to(tl.int32)
        e = tl.where((tl.arange(0, CHUNK) < 64)[None, :], e_lo[:, None], e_hi[:, None])
        # e4m3 values and powers of two are exact in bf16, and so is their product
        k = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * (e << 23).to(tl.float32,
                                                                                  bitcast=True)
        if c * CHUNK + CHUNK > A_DIM:
            rope = (data + A_DIM).to(tl.pointer_type(tl.bfloat16))
            rmask = valid[:, None] & ((cols >= A_DIM) & (cols < D))[None, :]
            kr = tl.load(rope[:, None] + (cols - A_DIM)[None, :], mask=rmask, other=0.0)
            k = tl.where((cols < A_DIM)[None, :], k, kr.to(tl.float32))
    else:
        k = tl.load(kv_ptr + idx[:, None] * skv + cols[None, :],
                    mask=valid[:, None] & (cols < D)[None, :], other=0.0)
    if ROUND_OPS:  # interpreter: bf16 rows arrive as fp32 (already bf16 values)
        k = k.to(tl.float32)
    return k.to(OP_DTYPE)


def _k_scores_py(q0, q1, q2, q3, u, idx, N0, kv0, skv0, psh0, pby0, kv1, skv1, psh1, pby1,
                 scale, CHUNK: tl.constexpr, NCH: tl.constexpr, D: tl.constexpr,
                 A_DIM: tl.constexpr, FP8: tl.constexpr, ROUND_OPS: tl.constexpr,
                 OP_DTYPE: tl.constexpr, PREC: tl.constexpr, TWO: tl.constexpr):
    """Tile of unit u with row ids idx [TILE_N] (-1 = no key): logits x = scale·q·k
    [BLOCK_H, TILE_N] (-inf = no key) and the tile's row chunks k0..k3 [TILE_N, CHUNK] (the
    value dot reuses them: K = V)."""
    if TWO:
        first = u < N0
        kv = kv0 + tl.where(first, 0, kv1)  # kv1: source 1 as an element offset from kv0
        skv = tl.where(first, skv0, skv1)
        psh = tl.where(first, psh0, psh1)
        pby = tl.where(first, pby0, pby1).to(tl.int64)
    else:
        kv = kv0
        skv = skv0
        psh = psh0
        pby = pby0.to(tl.int64)
    valid = idx >= 0
    idx = idx.to(tl.int64)
    k0 = _k_chunk(kv, idx, valid, skv, psh, pby, 0, CHUNK, D, A_DIM, FP8, ROUND_OPS, OP_DTYPE)
    x = tl.dot(q0, tl.trans(k0), input_precision=PREC)
    k1 = k0
    k2 = k0
    k3 = k0
    if NCH > 1:
        k1 = _k_chunk(kv, idx, valid, skv, psh, pby, 1, CHUNK, D, A_DIM, FP8, ROUND_OPS,
                      OP_DTYPE)
        x = tl.dot(q1, tl.trans(k1), x, input_precision=PREC)
    if NCH > 2:
        k2 = _k_chunk(kv, idx, valid, skv, psh, pby, 2, CHUNK, D, A_DIM, FP8, ROUND_OPS,
                      OP_DTYPE)
        x = tl.dot(q2, tl.trans(k2), x, input_precision=PREC)
    if NCH > 3:
        k3 = _k_chunk(kv, idx, valid, skv, psh, pby, 3, CHUNK, D, A_DIM, FP8, ROUND_OPS,
                      OP_DTYPE)
        x = tl.dot(q3, tl.trans(k3), x, input_precision=PREC)
    x = tl.where(valid[None, :], x * scale, float("-inf"))
    return x, k0, k1, k2, k3


def _k_pv_py(p, k0, k1, k2, k3, a0, a1, a2, a3, alpha, NCH: tl.constexpr, PREC: tl.constexpr,
             FIRST: tl.constexpr):
    """a_c = a_c·alpha + p·k_c per column chunk; FIRST starts fresh accumulators (a_c and
    alpha ignored)."""
    if FIRST:
        a0 = tl.dot(p, k0, input_precision=PREC)
        a1 = a0
        a2 = a0
        a3 = a0
        if NCH > 1:
            a1 = tl.dot(p, k1, input_precision=PREC)
        if NCH > 2:
            a2 = tl.dot(p, k2, input_precision=PREC)
        if NCH > 3:
            a3 = tl.dot(p, k3, input_precision=PREC)
    else:
        a0 = tl.dot(p, k0, a0 * alpha[:, None], input_precision=PREC)
        if NCH > 1:
            a1 = tl.dot(p, k1, a1 * alpha[:, None], input_precision=PREC)
        if NCH > 2:
            a2 = tl.dot(p, k2, a2 * alpha[:, None], input_precision=PREC)
        if NCH > 3:
            a3 = tl.dot(p, k3, a3 * alpha[:, None], input_precision=PREC)
    return a0, a1, a2, a3


def _k_exact_run_py(q0, q1, q2, q3, m_i, l_i, a0, a1, a2, a3, lo, hi, N0, id0, K0, id1, K1,
                    kv0, skv0, psh0, pby0, kv1, skv1, psh1, pby1, scale,
                    TILE_N: tl.constexpr, CHUNK: tl.constexpr, NCH: tl.constexpr,
                    D: tl.constexpr, A_DIM: tl.constexpr, FP8: tl.constexpr,
                    ROUND_OPS: tl.constexpr, OP_DTYPE: tl.constexpr, PREC: tl.constexpr,
                    TWO: tl.constexpr):
    """Tiles [lo, hi) into a running fp32 online softmax (the exact path). The next tile's
    row ids are loaded one iteration ahead: the key loads then depend on a loop-carried value
    only, and Triton's pipeliner (num_stages >= 3) keeps the next tiles' copies in flight
    while this one computes (with the ids loaded in the same iteration it waits for every copy
    before computing)."""
    idx = _k_ids(lo, 0, N0, id0, K0, id1, K1, TILE_N, 1, TWO)
    for u in range(lo, hi):
        idx_next = _k_ids(u + 1, 0, N0, id0, K0, id1, K1, TILE_N, 1, TWO)
        x, k0, k1, k2, k3 = _k_scores(q0, q1, q2, q3, u, idx, N0, kv0, skv0, psh0, pby0, kv1,
                                      skv1, psh1, pby1, scale, CHUNK, NCH, D, A_DIM, FP8,
                                      ROUND_OPS, OP_DTYPE, PREC, TWO)
        idx = idx_next
        m_new = tl.maximum(m_i, tl.max(x, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)  # 0 while nothing was seen
        p = tl.exp(x - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        a0, a1, a2, a3 = _k_pv(_k_op(p, ROUND_OPS, OP_DTYPE), k0, k1, k2, k3, a0, a1, a2, a3,
                               alpha, NCH, PREC, False)
        m_i = m_new
    return m_i, l_i, a0, a1, a2, a3


def _k_close_py(m_use, l_s, big_m, tot, den, l0, NO_RESCALE: tl.constexpr):
    """Close a split (running max m_use, sum l_s): 1/l_s, and its weight w in the running merge
    with the rescale alpha of what was merged before. LSE merge: w = exp(lse_s − M'),
    alpha = exp(M − M'); the fault: w = l_s / l0 (l0 = the first non-empty split's sum, so a
    lone split keeps weight 1 exactly), alpha = 1. `tot` = Σ exp(lse_s − M) in both (the LSE
    for the sink), `den` = Σ l_s / l0 (the fault's normaliser)."""
    has = l_s > 0
    inv = tl.math.div_rn(tl.full(l_s.shape, 1.0, tl.float32), tl.where(has, l_s, 1.0))
    lse_s = tl.where(has, m_use + tl.log(tl.where(has, l_s, 1.0)), float("-inf"))
    m_new = tl.maximum(big_m, lse_s)
    m_fix = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(big_m - m_fix)
    w = tl.exp(lse_s - m_fix)  # 1 for the largest split so far, 0 for an empty one
    tot = tot * alpha + w
    if NO_RESCALE:
        l0 = tl.where(l0 > 0, l0, l_s)
        w = tl.where(has, tl.math.div_rn(l_s, tl.where(l0 > 0, l0, 1.0)), 0.0)
        den = den + w
        alpha = tl.full(alpha.shape, 1.0, tl.float32)
    return inv, alpha, w, m_new, tot, den, l0


def _k_fold_py(a, t, inv, alpha, w, ROUND_PARTIAL: tl.constexpr):
    """a·alpha + w·o_s with the split's partial o_s = t / l_s, rounded to bf16 (the patch)."""
    o = t * inv[:, None]
    if ROUND_PARTIAL:
        o = round_bf16(o)
    return a * alpha[:, None] + w[:, None] * o


def _k_patch_run_py(q0, q1, q2, q3, big_m, tot, den, l0, a0, a1, a2, a3, lo, hi, N0, id0, K0,
                    id1, K1, kv0, skv0, psh0, pby0, kv1, skv1, psh1, pby1, scale,
                    TILE_N: tl.constexpr, CHUNK: tl.constexpr, NCH: tl.constexpr,
                    D: tl.constexpr, A_DIM: tl.constexpr, FP8: tl.constexpr,
                    ROUND_OPS: tl.constexpr, OP_DTYPE: tl.constexpr, PREC: tl.constexpr,
                    SPLIT_TILES: tl.constexpr, ROUND_PARTIAL: tl.constexpr,
                    NO_RESCALE: tl.constexpr, TWO: tl.constexpr):
    """Splits [lo, hi), each SPLIT_TILES tiles: the split's partial o_s = Σ p·v / l_s, rounded
    to bf16 (ROUND_PARTIAL), is merged at once into the running fp32 merge (see _k_close).
    With one tile per split the split closes before its value dots, so each chunk's p·v is
    folded as soon as it is computed (one [BLOCK_H, CHUNK] temporary)."""
    idx = _k_ids(lo, 0, N0, id0, K0, id1, K1, TILE_N, SPLIT_TILES, TWO)
    for u in range(lo, hi):
        if SPLIT_TILES == 1:
            idx_next = _k_ids(u + 1, 0, N0, id0, K0, id1, K1, TILE_N, 1, TWO)  # _k_exact_run
            x, k0, k1, k2, k3 = _k_scores(q0, q1, q2, q3, u, idx, N0, kv0, skv0, psh0, pby0,
                                          kv1, skv1, psh1, pby1, scale, CHUNK, NCH, D, A_DIM,
                                          FP8, ROUND_OPS, OP_DTYPE, PREC, TWO)
            idx = idx_next
            m_s = tl.max(x, 1)
            m_use = tl.where(m_s == float("-inf"), 0.0, m_s)
            p = tl.exp(x - m_use[:, None])
            inv, alpha, w, big_m, tot, den, l0 = _k_close(m_use, tl.sum(p, 1), big_m, tot, den,
                                                          l0, NO_RESCALE)
            pb = _k_op(p, ROUND_OPS, OP_DTYPE)
            a0 = _k_fold(a0, tl.dot(pb, k0, input_precision=PREC), inv, alpha, w, ROUND_PARTIAL)
            if NCH > 1:
                a1 = _k_fold(a1, tl.dot(pb, k1, input_precision=PREC), inv, alpha, w,
                             ROUND_PARTIAL)
            if NCH > 2:
                a2 = _k_fold(a2, tl.dot(pb, k2, input_precision=PREC), inv, alpha, w,
                             ROUND_PARTIAL)
            if NCH > 3:
                a3 = _k_fold(a3, tl.dot(pb, k3, input_precision=PREC), inv, alpha, w,
                             ROUND_PARTIAL)
        else:
            for jj in tl.static_range(SPLIT_TILES):
                ids = _k_ids(u, jj, N0, id0, K0, id1, K1, TILE_N, SPLIT_TILES, TWO)
                x, k0, k1, k2, k3 = _k_scores(q0, q1, q2, q3, u, ids, N0, kv0, skv0, psh0,
                                              pby0, kv1, skv1, psh1, pby1, scale, CHUNK, NCH,
                                              D, A_DIM, FP8, ROUND_OPS, OP_DTYPE, PREC, TWO)
                if jj == 0:
                    m_s = tl.max(x, 1)
                    m_use = tl.where(m_s == float("-inf"), 0.0, m_s)
                    p = tl.exp(x - m_use[:, None])
                    l_s = tl.sum(p, 1)
                    t0, t1, t2, t3 = _k_pv(_k_op(p, ROUND_OPS, OP_DTYPE), k0, k1, k2, k3,
                                           l_s, l_s, l_s, l_s, l_s, NCH, PREC, True)
                else:
                    m_prev = m_s  # -inf while the split has seen no key: beta = 0
                    m_s = tl.maximum(m_s, tl.max(x, 1))
                    m_use = tl.where(m_s == float("-inf"), 0.0, m_s)
                    beta = tl.exp(m_prev - m_use)
                    p = tl.exp(x - m_use[:, None])
                    l_s = l_s * beta + tl.sum(p, 1)
                    t0, t1, t2, t3 = _k_pv(_k_op(p, ROUND_OPS, OP_DTYPE), k0, k1, k2, k3,
                                           t0, t1, t2, t3, beta, NCH, PREC, False)
            inv, alpha, w, big_m, tot, den, l0 = _k_close(m_use, l_s, big_m, tot, den, l0,
                                                          NO_RESCALE)
            a0 = _k_fold(a0, t0, inv, alpha, w, ROUND_PARTIAL)
            if NCH > 1:
                a1 = _k_fold(a1, t1, inv, alpha, w, ROUND_PARTIAL)
            if NCH > 2:
                a2 = _k_fold(a2, t2, inv, alpha, w, ROUND_PARTIAL)
            if NCH > 3:
                a3 = _k_fold(a3, t3, inv, alpha, w, ROUND_PARTIAL)
    return big_m, tot, den, l0, a0, a1, a2, a3


def _k_finish_py(a, c: tl.constexpr, norm, keep, dst, offs_h, hmask, CHUNK: tl.constexpr,
                 D: tl.constexpr, ROUND_OUT: tl.constexpr, stride_h):
    """Store chunk c of a / norm (· keep, rounded to bf16 when ROUND_OUT) at dst[h, cols]."""
    cols = c * CHUNK + tl.arange(0, CHUNK)
    o = tl.math.div_rn(a, tl.broadcast_to(norm[:, None], a.shape)) * keep[:, None]
    if ROUND_OUT:
        o = round_bf16(o)
    tl.store(dst + offs_h[:, None] * stride_h + cols[None, :], o,
             mask=hmask[:, None] & (cols < D)[None, :])


_DEVICE_HELPERS = ("_load_rows", "_k_op", "_k_ids", "_k_chunk", "_k_scores", "_k_pv",
                   "_k_exact_run", "_k_close", "_k_fold", "_k_patch_run", "_k_finish")


@functools.cache
def _kernels(interpret: bool) -> SimpleNamespace:
    """Build the jitted kernels once per mode (see `_triton.jit_helpers`)."""
    install_helpers(globals(), interpret)
    for name in _DEVICE_HELPERS:
        globals()[name] = triton.jit(globals()[name + "_py"])

    @triton.jit
    def split_partials(
        q_ptr, kv0_ptr, idx0_ptr, o_ptr, lse_ptr, lsum_ptr, sink_ptr, out_ptr,
        kv1_off, idx1_off, H, K0, K1, N0, N1, UPP, S_prog, scale, psh0, pby0, psh1, pby1,
        stride_qt, stride_qh, stride_kv0, stride_kv1, stride_i0, stride_i1, stride_ot, stride_oh,
        D: tl.constexpr, A_DIM: tl.constexpr, CHUNK: tl.constexpr, NCH: tl.constexpr,
        FP8: tl.constexpr, TWO_SOURCES: tl.constexpr, TILE_N: tl.constexpr,
        BLOCK_H: tl.constexpr,
        SPLIT_TILES: tl.constexpr, OP_DTYPE: tl.constexpr, ROUND_OPS: tl.constexpr,
        ROUND_PARTIAL: tl.constexpr, NO_RESCALE: tl.constexpr, FINAL: tl.constexpr,
    ):
        # program (head block, token t, run s): units [s·UPP, s·UPP + UPP) of the token's
        # concatenated unit list (source 0's N0 units, then source 1's N1). Source 1's cache and
        # lists are passed as element offsets from source 0's (kv1_off, idx1_off).
        offs_h = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
        t = tl.program_id(1).to(tl.int64)
        s = tl.program_id(2)
        hmask = offs_h < H
        q_rows = q_ptr + t * stride_qt + offs_h[:, None] * stride_qh
        cq = tl.arange(0, CHUNK)
        q0 = _k_op(tl.load(q_rows + cq[None, :], mask=hmask[:, None] & (cq < D)[None, :],
                           other=0.0), ROUND_OPS, OP_DTYPE)
        q1 = q0
        q2 = q0
        q3 = q0
        if NCH > 1:
            q1 = _k_op(tl.load(q_rows + CHUNK + cq[None, :],
                               mask=hmask[:, None] & (CHUNK + cq < D)[None, :], other=0.0),
                       ROUND_OPS, OP_DTYPE)
        if NCH > 2:
            q2 = _k_op(tl.load(q_rows + 2 * CHUNK + cq[None, :],
                               mask=hmask[:, None] & (2 * CHUNK + cq < D)[None, :], other=0.0),
                       ROUND_OPS, OP_DTYPE)
        if NCH > 3:
            q3 = _k_op(tl.load(q_rows + 3 * CHUNK + cq[None, :],
                               mask=hmask[:, None] & (3 * CHUNK + cq < D)[None, :], other=0.0),
                       ROUND_OPS, OP_DTYPE)
        lo = s * UPP
        hi = tl.minimum(lo + UPP, N0 + N1)
        id0 = idx0_ptr + t * stride_i0
        id1 = idx1_off + t * stride_i1 - t * stride_i0  # offset from id0
        v0 = tl.full([BLOCK_H], float("-inf"), tl.float32)  # m_i (exact) / running max M
        v1 = tl.zeros([BLOCK_H], tl.float32)  # l_i (exact) / tot
        v2 = tl.zeros([BLOCK_H], tl.float32)  # den (fault)
        v3 = tl.zeros([BLOCK_H], tl.float32)  # l0 (fault)
        a0 = tl.zeros([BLOCK_H, CHUNK], tl.float32)
        a1 = tl.zeros([BLOCK_H, CHUNK], tl.float32)
        a2 = tl.zeros([BLOCK_H, CHUNK], tl.float32)
        a3 = tl.zeros([BLOCK_H, CHUNK], tl.float32)
        if SPLIT_TILES == 0:
            v0, v1, a0, a1, a2, a3 = _k_exact_run(
                q0, q1, q2, q3, v0, v1, a0, a1, a2, a3, lo, hi, N0, id0, K0, id1, K1,
                kv0_ptr, stride_kv0, psh0, pby0, kv1_off, stride_kv1, psh1, pby1, scale,
                TILE_N, CHUNK, NCH, D, A_DIM, FP8, ROUND_OPS, OP_DTYPE, "ieee", TWO_SOURCES)
            norm = tl.where(v1 > 0, v1, 1.0)
            v2 = v1  # lsum = l
            v3 = tl.full([BLOCK_H], 1.0, tl.float32)
        else:
            v0, v1, v2, v3, a0, a1, a2, a3 = _k_patch_run(
                q0, q1, q2, q3, v0, v1, v2, v3, a0, a1, a2, a3, lo, hi, N0, id0, K0, id1, K1,
                kv0_ptr, stride_kv0, psh0, pby0, kv1_off, stride_kv1, psh1, pby1, scale,
                TILE_N, CHUNK, NCH, D, A_DIM, FP8, ROUND_OPS, OP_DTYPE, "ieee", SPLIT_TILES,
                ROUND_PARTIAL, NO_RESCALE, TWO_SOURCES)
            if NO_RESCALE:
                norm = tl.where(v2 > 0, v2, 1.0)
            else:
                norm = tl.where(v1 > 0, v1, 1.0)
        # lse of the run: M + log(tot) (exact: m + log(l)); lsum = Σ l_s (fault weights)
        m_fin = tl.where(v0 == float("-inf"), 0.0, v0)
        lse = tl.where(v1 > 0, m_fin + tl.log(tl.where(v1 > 0, v1, 1.0)), float("-inf"))
        if FINAL:  # one run per token: apply the sink, write the output
            sink = tl.load(sink_ptr + offs_h, mask=hmask, other=0.0).to(tl.float32)
            top = tl.maximum(lse, sink)
            top = tl.where(top == float("-inf"), 0.0, top)
            lae = top + tl.log(tl.exp(lse - top) + tl.exp(sink - top))
            keep = tl.where(lse > float("-inf"), tl.exp(lse - lae), 0.0)
            dst = out_ptr + t * stride_ot
            sh = stride_oh
            rnd = ROUND_PARTIAL
        else:  # partial of this run: [T, S_prog, H, D] fp32 + lse, lsum [T, S_prog, H]
            keep = tl.full([BLOCK_H], 1.0, tl.float32)
            row = (t * S_prog + s) * H
            dst = o_ptr + row * D
            sh = D
            rnd = False
            tl.store(lse_ptr + row + offs_h, lse, mask=hmask)
            tl.store(lsum_ptr + row + offs_h, v2 * v3, mask=hmask)
        _k_finish(a0, 0, norm, keep, dst, offs_h, hmask, CHUNK, D, rnd, sh)
        if NCH > 1:
            _k_finish(a1, 1, norm, keep, dst, offs_h, hmask, CHUNK, D, rnd, sh)
        if NCH > 2:
            _k_finish(a2, 2, norm, keep, dst, offs_h, hmask, CHUNK, D, rnd, sh)
        if NCH > 3:
            _k_finish(a3, 3, norm, keep, dst, offs_h, hmask, CHUNK, D, rnd, sh)

    @triton.jit
    def merge_partials(
        o_ptr, lse_ptr, lsum_ptr, sink_ptr, out_ptr,
        H, D, S, stride_ot, stride_oh,
        NO_RESCALE: tl.constexpr, ROUND_OUT: tl.constexpr,
        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        # program (head h, token t, d block): merge the S partials o [T, S, H, D] of (t, h),
        # BLOCK_S at a time (one wide load each), then apply the sink.
        h = tl.program_id(0)
        t = tl.program_id(1).to(tl.int64)
        offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        dmask = offs_d < D
        offs_s = tl.arange(0, BLOCK_S)
        big_m = tl.full([], float("-inf"), tl.float32)
        for s0 in range(0, S, BLOCK_S):
            smask = s0 + offs_s < S
            lse = tl.load(lse_ptr + (t * S + s0 + offs_s) * H + h, mask=smask, other=float("-inf"))
            big_m = tl.maximum(big_m, tl.max(lse, 0))
        big_m = tl.where(big_m == float("-inf"), 0.0, big_m)
        tot = tl.zeros([], tl.float32)
        den = tl.zeros([], tl.float32)
        for s0 in range(0, S, BLOCK_S):
            rows = (t * S + s0 + offs_s) * H + h
            smask = s0 + offs_s < S
            w = tl.exp(tl.load(lse_ptr + rows, mask=smask, other=float("-inf")) - big_m)
            tot += tl.sum(w, 0)
            if NO_RESCALE:  # the fault: local sums, no exp(m_s - M) factor
                w = tl.load(lsum_ptr + rows, mask=smask, other=0.0)
            den += tl.sum(w, 0)
        den = tl.where(den > 0, den, 1.0)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s0 in range(0, S, BLOCK_S):  # Σ_s (w_s / Σ w)·o_s: a lone partial gets weight 1
            rows = (t * S + s0 + offs_s) * H + h
            smask = s0 + offs_s < S
            if NO_RESCALE:
                w = tl.load(lsum_ptr + rows, mask=smask, other=0.0)
            else:
                w = tl.exp(tl.load(lse_ptr + rows, mask=smask, other=float("-inf")) - big_m)
            o = tl.load(o_ptr + rows[:, None] * D + offs_d[None, :],
                        mask=smask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(tl.math.div_rn(w, tl.broadcast_to(den, w.shape))[:, None] * o, 0)
        # sink: out *= exp(LSE - logaddexp(LSE, sink)), LSE = M + log Σ exp(lse_s - M)
        lse_all = tl.where(tot > 0, big_m + tl.log(tl.where(tot > 0, tot, 1.0)), float("-inf"))
        sink = tl.load(sink_ptr + h).to(tl.float32)
        top = tl.maximum(lse_all, sink)
        top = tl.where(top == float("-inf"), 0.0, top)
        lae = top + tl.log(tl.exp(lse_all - top) + tl.exp(sink - top))
        keep = tl.where(lse_all > float("-inf"), tl.exp(lse_all - lae), 0.0)
        out = acc * keep
        if ROUND_OUT:
            out = round_bf16(out)
        tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_d, out, mask=dmask)

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
    tile_n: keys per tile (16/32/64); block_h: heads per program (tl.dot's M: 64 = one wgmma
    warp group on sm_90); tiles: tiles per program (the run a program merges in registers; a
    multiple of split / tile_n on the patch path); num_warps / num_stages: Triton's launch
    options (num_stages = software-pipelining depth of the key-tile loads)."""

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


@dataclass(frozen=True)
class _Plan:
    """How one call is laid out: tiles of `tile` keys, `split_tiles` per patch split (0 = the
    exact path), `units` per source (splits or tiles), `upp` units per program, `s_prog`
    programs (runs) per token and head block."""

    tile: int
    split_tiles: int
    block_h: int
    chunk: int
    units: tuple[int, ...]
    upp: int
    s_prog: int
    num_warps: int
    num_stages: int


def _alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Scratch allocation (a seam for tests, which poison scratch with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.cache
def _device_facts(device: torch.device) -> tuple[int, bool]:
    """(multiprocessors, small shared memory): SM86/89/120 have ~100 KB per block, sm_80/90
    ~164/227 KB. The interpreter counts 4 'SMs' so that small tests take the multi-run path."""
    if device.type != "cuda":
        return 4, False
    props = torch.cuda.get_device_properties(device)
    small = (props.major, props.minor) in {(8, 6), (8, 7), (8, 9), (12, 0), (12, 1)}
    return props.multi_processor_count, small


@functools.cache
def _runs_per_token(units: int, work: int, slots: int) -> int:
    """Programs per (token, head block) for `units` units each: the fewest programs that
    minimise waves × units per program (1 program per SM slot per wave), counting a merge
    pass (partials written and re-read) as one unit."""
    best, best_cost = 1, math.inf
    for s in range(1, min(units, max(1, 4 * slots // work)) + 1):
        upp = math.ceil(units / s)
        s_eff = math.ceil(units / upp)
        cost = math.ceil(work * s_eff / slots) * upp + (1 if s_eff > 1 else 0)
        if cost < best_cost:
            best, best_cost = s_eff, cost
    return best


def _plan(split: int | None, srcs: list[_Source], T: int, H: int, D: int, low: bool,
          device: torch.device, cfg: AttnConfig) -> _Plan:
    """Launch layout (AttnConfig fields override). Wide rows (D = 512) on the H200:
    - 64 heads (one wgmma warp group, 8 warps; q in shared memory, 64 KB): the exact path
      takes 32-key tiles 3 stages deep (loads two tiles ahead, 160 KB); a 64-key patch split
      is one 64-key tile, 2 stages (192 KB; the copy of the next tile is issued after this
      tile's dots, so load and compute alternate - 3 stages would need 256 KB).
    - 16-32 heads (mma.sync): 64-key tiles, 3 stages (q 16-32 KB + 192 KB).
    - fp32 rows (the tests' exact reference path): 16 heads, 32-key tiles, 1 stage.
    - ~100 KB GPUs (SM86/89/120): <= 32 heads, 32-key tiles, 2 stages (1 for MODEL1), no wgmma.
    Programs per token: enough runs to fill the SMs once (see _runs_per_token)."""
    n_sm, small_smem = _device_facts(device)
    wide = D >= 256
    block_h = cfg.block_h or min(64, max(16, next_pow2(H)))
    if cfg.block_h is None and wide and not low:
        block_h = 16  # fp32 dots run on FMA units: keep the operands small
    if cfg.block_h is None and wide and small_smem:
        block_h = min(block_h, 32)  # q of 64 heads alone would take 64 of the ~100 KB
    if small_smem or not low:
        tile = 32 if wide else 64
    else:
        tile = 32 if wide and block_h >= 64 and split is None else 64
    tile = cfg.tile_n or tile
    split_tiles = 0
    if split is not None:
        tile = min(tile, split)
        split_tiles = split // tile
    if cfg.block_h is None and wide and split_tiles > 1:
        block_h = min(block_h, 32)  # a split of several tiles keeps a second accumulator set
    chunk = min(128, max(16, next_pow2(D)))
    units = tuple(math.ceil(s.indices.shape[1] / (split or tile)) for s in srcs)
    total = max(1, sum(units))
    work = T * math.ceil(H / block_h)
    if cfg.tiles:
        upp = max(1, cfg.tiles // max(1, split_tiles))
    else:
        upp = math.ceil(total / _runs_per_token(total, work, n_sm))
    num_warps = cfg.num_warps or (8 if block_h >= 32 and wide and low else 4)
    if not wide:
        stages = 2
    elif small_smem or not low:
        stages = 1 if (srcs[0].fp8 or not low) else 2
    else:
        stages = 2 if block_h >= 64 and tile >= 64 else 3
    return _Plan(tile, split_tiles, block_h, chunk, units, upp, math.ceil(total / upp),
                 num_warps, cfg.num_stages or stages)


def _launch(q, srcs, sink, scale, *, split, pdt, merge, out, baseline,
            config: AttnConfig | None = None) -> torch.Tensor:
    """Run the split-K kernel (or the baseline) for every source into out [T, H, D]."""
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
    two = len(srcs) > 1  # the kernel reaches source 1's lists from source 0's: one dtype
    srcs = [s if s.indices.stride(-1) == 1 and not (two and s.indices.dtype != torch.int32)
            else _Source(s.data, s.indices.to(torch.int32 if two else s.indices.dtype)
                         .contiguous(), s.fp8, s.page, s.page_bytes) for s in srcs]
    if baseline:
        return _launch_baseline(ks, q, srcs, sink, scale, out)
    if len(srcs) > 2:
        raise ValueError(f"the split-K kernel takes one or two key sources, got {len(srcs)}")
    if D > 512:
        raise ValueError(f"the split-K kernel supports head dims up to 512, got {D}")
    low = srcs[0].fp8 or srcs[0].data.dtype in (torch.bfloat16, torch.float16)
    if low and not interp and q.dtype != torch.bfloat16:
        q = q.to(torch.bfloat16)  # the operand the kernel rounds to anyway; loaded as is, wgmma
        #                           reads it from shared memory instead of 128 registers/thread
    p = _plan(split, srcs, T, H, D, low, q.device, config or AttnConfig())
    final = p.s_prog == 1
    consts = dict(D=D, A_DIM=NOPE if srcs[0].fp8 else D, CHUNK=p.chunk,
                  NCH=math.ceil(D / p.chunk), FP8=srcs[0].fp8, TWO_SOURCES=len(srcs) > 1,
                  TILE_N=p.tile, BLOCK_H=p.block_h, SPLIT_TILES=p.split_tiles,
                  OP_DTYPE=tl.bfloat16 if low and not interp else tl.float32,
                  ROUND_OPS=low and interp, ROUND_PARTIAL=pdt == torch.bfloat16,
                  NO_RESCALE=merge == "no-rescale", FINAL=final,
                  num_warps=p.num_warps, num_stages=p.num_stages)
    per_row = 1 if final else p.s_prog * H * (D * 4 + 8)
    rows = max(1, min(T, _MAX_GRID_Y, _SCRATCH_BYTES // per_row))
    for t0 in range(0, T, rows):
        tb = min(rows, T - t0)
        if final:  # no partials: the placeholders are never touched
            o = lse = lsum = out
        else:
            o = _alloc((tb, p.s_prog, H, D), torch.float32, q.device)
            lse = _alloc((tb, p.s_prog, H), torch.float32, q.device)
            lsum = _alloc((tb, p.s_prog, H), torch.float32, q.device)
        _split_call(ks, p, q[t0:], srcs, t0, tb, o, lse, lsum, sink, out[t0:], scale, consts)
        if not final:
            _merge(ks, o, lse, lsum, sink, out[t0:], merge, pdt == torch.bfloat16)
    return out


def _split_call(ks, p: _Plan, q, srcs, t0, tb, o, lse, lsum, sink, out, scale, consts) -> None:
    """One split_partials launch for queries [t0, t0 + tb): source 1 (if any) is passed as
    element offsets from source 0's cache and lists."""
    s0, s1 = srcs[0], srcs[-1]
    i0, i1 = s0.indices[t0 : t0 + tb], s1.indices[t0 : t0 + tb]
    two = len(srcs) > 1
    ks.split_partials[(math.ceil(q.shape[1] / p.block_h), tb, p.s_prog)](
        q, s0.data, i0, o, lse, lsum, sink, out,
        _elements_between(s0.data, s1.data), _elements_between(i0, i1),
        q.shape[1], i0.shape[1], i1.shape[1] if two else 0, p.units[0],
        p.units[1] if two else 0, p.upp, p.s_prog, float(scale),
        s0.page.bit_length() - 1, s0.page_bytes, s1.page.bit_length() - 1, s1.page_bytes,
        q.stride(0), q.stride(1), s0.data.stride(0), s1.data.stride(0),
        i0.stride(0), i1.stride(0), out.stride(0), out.stride(1), **consts)


def _elements_between(a: torch.Tensor, b: torch.Tensor) -> int:
    """b's first element as an offset in elements from a's (same dtype, same device): the
    kernel addresses a second source from the first source's pointer."""
    if a.dtype != b.dtype:
        raise ValueError(f"two key sources must share a dtype, got {a.dtype} and {b.dtype}")
    delta = b.data_ptr() - a.data_ptr()
    if delta % a.element_size():
        raise ValueError("key sources must be aligned to their element size")
    return delta // a.element_size()


def _merge(ks, o, lse, lsum, sink, out, merge: str, round_out: bool) -> None:
    """Merge partials o [T, S, H, D] (+ lse, lsum [T, S, H]) into out [T, H, D], with the sink."""
    T, S, H, D = o.shape
    block_d = min(128, max(16, next_pow2(D)))
    ks.merge_partials[(H, T, math.ceil(D / block_d))](
        o, lse, lsum, sink, out, H, D, S, out.stride(0), out.stride(1),
        NO_RESCALE=merge == "no-rescale", ROUND_OUT=round_out,
        BLOCK_S=min(32, max(2, next_pow2(S))), BLOCK_D=block_d)


def _launch_baseline(ks, q, srcs, sink, scale, out) -> torch.Tensor:
    """Non-MMA baseline: one program per (token, head) and source, bf16 partials, merged."""
    T, H, D = q.shape
    fp8 = srcs[0].fp8
    a_dim, b_dim = (NOPE, ROPE) if fp8 else (D, 0)
    consts = dict(D=D, A_DIM=a_dim, BLOCK_A=max(16, next_pow2(a_dim)), BLOCK_B=max(16, b_dim),
                  HAS_B=b_dim > 0, FP8=fp8)
    S = len(srcs)
    rows = max(1, min(T, _MAX_GRID_Y, _SCRATCH_BYTES // (S * H * (D * 2 + 8))))
    for t0 in range(0, T, rows):
        tb = min(rows, T - t0)
        o = _alloc((tb, S, H, D), torch.bfloat16, q.device)
        lse = _alloc((tb, S, H), torch.float32, q.device)
        lsum = _alloc((tb, S, H), torch.float32, q.device)
        for s_off, src in enumerate(srcs):
            idx = src.indices[t0 : t0 + tb]
            ks.baseline_partial[(tb, H)](
                q[t0:], src.data, idx, o, lse, lsum, H, idx.shape[1], S, s_off, float(scale),
                q.stride(0), q.stride(1), src.data.stride(0), idx.stride(0), **consts,
                PAGE=src.page, PAGE_BYTES=src.page_bytes, BLOCK_T=16, ROUND_PARTIAL=True)
        _merge(ks, o, lse, lsum, sink, out[t0:], "lse", True)
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
