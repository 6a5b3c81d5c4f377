"""Lightning-indexer logits and top-k selection for CSA layers (patch 4).

`score[t, s] = Σ_h w[t, h] · relu(q[t, h] · k[s])` over the visible compressed entries
(s < n_visible[t]; the rest are -inf), in fp32. `mode="bf16"` rounds each per-head dot product
q[t, h]·k[s] to bf16 before relu, weight and head sum: the numerics of the Triton/bf16 indexer
patch (in SGLang ≥ 0.5.17 the bmm runs on fp8→bf16 operands and writes bf16). The top-k of the
scores picks which compressed entries a CSA layer attends to, so rounding flips near-ties.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from ._triton import install_helpers, interpreter_active, next_pow2, require_triton

try:  # guarded: the references import without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = tl = None

MODES = ("fp32", "bf16")
_BLOCK_BYTES = 48 << 20  # working-set budget of one query block in the reference


def check_indexer_args(
    q: torch.Tensor, w: torch.Tensor, k: torch.Tensor, n_visible: torch.Tensor, mode: str
) -> None:
    """Validate shapes and options shared by the reference and the Triton wrapper."""
    if q.dim() != 3:
        raise ValueError(f"q must be [T, H, d], got shape {tuple(q.shape)}")
    T, H, d = q.shape
    if w.shape != (T, H):
        raise ValueError(f"w must be [{T}, {H}], got {tuple(w.shape)}")
    if k.dim() != 2 or k.shape[1] != d:
        raise ValueError(f"k must be [S, {d}], got {tuple(k.shape)}")
    if n_visible.shape != (T,):
        raise ValueError(f"n_visible must be [{T}], got {tuple(n_visible.shape)}")
    if n_visible.dtype.is_floating_point or n_visible.dtype == torch.bool:
        raise ValueError(f"n_visible must be an integer tensor, got {n_visible.dtype}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def indexer_logits_ref(
    q: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    n_visible: torch.Tensor,
    *,
    mode: str = "fp32",
) -> torch.Tensor:
    """PyTorch reference. q: [T, H, d], w: [T, H], k: [S, d], n_visible: [T] -> [T, S] fp32.

    Blocked over T; each block only computes the columns below its largest n_visible.
    """
    check_indexer_args(q, w, k, n_visible, mode)
    T, H, d = q.shape
    S = k.shape[0]
    out = torch.full((T, S), float("-inf"), dtype=torch.float32, device=q.device)
    if T == 0 or S == 0:
        return out
    nvis = n_visible.to(device=q.device, dtype=torch.long).clamp(0, S)
    rows = max(1, min(4096, _BLOCK_BYTES // (4 * (2 * H * S + S))))
    qf, wf, kf = q.float(), w.float(), k.float()
    cols = torch.arange(S, device=q.device)
    for t0 in range(0, T, rows):
        nb = nvis[t0 : t0 + rows]
        sb = int(nb.max())
        if sb == 0:
            continue
        qb = qf[t0 : t0 + rows]  # [Tb, H, d]
        dots = torch.matmul(qb, kf[:sb].T)  # [Tb, H, sb]
        if mode == "bf16":
            dots = dots.to(torch.bfloat16).float()
        dots.relu_()
        score = torch.bmm(wf[t0 : t0 + rows, None, :], dots)[:, 0]  # [Tb, sb]
        score.masked_fill_(cols[None, :sb] >= nb[:, None], float("-inf"))
        out[t0 : t0 + rows, :sb] = score
    return out


def indexer_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k entries per row. scores: [T, S] -> indices [T, k] int64.

    Valid entries come first, by descending score, ties to the lower index (deterministic also
    for the many exact ties that bf16 rounding and relu create); -inf entries and slots beyond S
    are -1. Exact: `torch.topk` finds the k-th value; rows where that value is tied beyond the
    k-th slot are redone with a unique int64 key per entry (ordered float bits · 2³² + reversed
    column), and the chosen k entries of every row are ordered by that key.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [T, S], got shape {tuple(scores.shape)}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    T, S = scores.shape
    out = torch.full((T, k), -1, dtype=torch.int64, device=scores.device)
    kk = min(k, S)
    if T == 0 or kk == 0:
        return out
    x = scores.float()
    vals, idx = torch.topk(x, kk, dim=-1)  # right values; tie choice and order unspecified
    if bool(torch.isnan(vals).any()):  # topk ranks NaN first: treat NaN as -inf instead
        x = torch.where(torch.isnan(x), float("-inf"), x)
        vals, idx = torch.topk(x, kk, dim=-1)
    thr = vals[:, -1:]
    tied = (torch.count_nonzero(x >= thr, dim=-1) > kk) & torch.isfinite(thr[:, 0])
    if bool(tied.any()):
        rows = torch.nonzero(tied)[:, 0]
        cols = torch.arange(S, device=x.device).expand(rows.numel(), S)
        vals[rows], idx[rows] = _by_key(x[rows], cols, kk)
    vals, idx = _by_key(vals, idx, kk)
    out[:, :kk] = torch.where(torch.isneginf(vals), -1, idx)
    return out


def _by_key(vals: torch.Tensor, cols: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest (value desc, column asc) of each row. vals, cols: [R, n] -> [R, k] each."""
    bits = (vals + 0.0).view(torch.int32).to(torch.int64)  # + 0.0: -0.0 ties with +0.0
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # monotone in the float value
    key = ordered * (1 << 32) + (0xFFFFFFFF - cols)  # cols < 2^32
    _, pos = torch.topk(key, k, dim=-1, largest=True, sorted=True)
    return torch.gather(vals, 1, pos), torch.gather(cols, 1, pos)


# ----------------------------------------------------------------------------------------------
# Triton: grid (token blocks, key blocks); tokens are tl.dot's M dimension, heads a loop
# ----------------------------------------------------------------------------------------------
round_bf16 = None  # a jitted helper, bound by install_helpers() when the kernels are built
MAX_HEAD_DIM = 256


@functools.cache
def _kernels(interpret: bool) -> SimpleNamespace:
    """Build the jitted kernel once per mode (see `_triton.jit_helpers`)."""
    install_helpers(globals(), interpret)

    @triton.jit
    def logits_kernel(
        q_ptr, w_ptr, k_ptr, nvis_ptr, out_ptr,
        T, H, d, S,
        stride_qt, stride_qh, stride_wt, stride_k, stride_ot,
        BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
        OP_DTYPE: tl.constexpr, BF16_DOTS: tl.constexpr,
    ):
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        s0 = tl.program_id(1) * BLOCK_S
        offs_s = s0 + tl.arange(0, BLOCK_S)
        tmask = offs_t < T
        smask = offs_s < S
        nvis = tl.load(nvis_ptr + offs_t, mask=tmask, other=0).to(tl.int32)
        acc = tl.zeros([BLOCK_T, BLOCK_S], dtype=tl.float32)
        if s0 < tl.max(nvis, 0):  # tiles past every token's visible length only write -inf
            offs_d = tl.arange(0, BLOCK_D)
            dmask = offs_d < d
            kt = tl.load(k_ptr + offs_s[:, None].to(tl.int64) * stride_k + offs_d[None, :],
                         mask=smask[:, None] & dmask[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
            kt = tl.trans(kt.to(OP_DTYPE))
            q_rows = q_ptr + offs_t[:, None].to(tl.int64) * stride_qt + offs_d[None, :]
            for h in range(H):
                qh = tl.load(q_rows + h * stride_qh, mask=tmask[:, None] & dmask[None, :],
                             other=0.0)
                dots = tl.dot(qh.to(OP_DTYPE), kt, input_precision="ieee")  # [BLOCK_T, BLOCK_S]
                if BF16_DOTS:
                    dots = round_bf16(dots)
                wh = tl.load(w_ptr + offs_t.to(tl.int64) * stride_wt + h, mask=tmask, other=0.0)
                acc += tl.maximum(dots, 0.0) * wh.to(tl.float32)[:, None]
        res = tl.where(offs_s[None, :] < nvis[:, None], acc, float("-inf"))
        tl.store(out_ptr + offs_t[:, None].to(tl.int64) * stride_ot + offs_s[None, :], res,
                 mask=tmask[:, None] & smask[None, :])

    return SimpleNamespace(logits=logits_kernel)


def indexer_logits(
    q: torch.Tensor,
    w: torch.Tensor,
    k: torch.Tensor,
    n_visible: torch.Tensor,
    *,
    mode: str = "fp32",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton indexer logits, same contract as `indexer_logits_ref` (CUDA tensors, or CPU
    tensors under TRITON_INTERPRET=1). fp32 q/k give fp32 (IEEE) dots; bf16 q/k use bf16 tensor
    cores (exact products, fp32 accumulation). `out` (optional, [T, S] fp32) gets the result."""
    check_indexer_args(q, w, k, n_visible, mode)
    require_triton(q, w, k, n_visible)
    T, H, d = q.shape
    S = k.shape[0]
    if d > MAX_HEAD_DIM:
        raise ValueError(f"the Triton indexer supports head dims up to {MAX_HEAD_DIM}, got {d}")
    if out is None:
        out = torch.empty(T, S, dtype=torch.float32, device=q.device)
    elif out.shape != (T, S) or out.dtype != torch.float32 or out.stride(-1) != 1:
        raise ValueError(f"out must be a [{T}, {S}] fp32 tensor with unit last stride")
    if T == 0 or S == 0:
        return out
    q, w, k = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, w, k))
    nvis = n_visible.to(torch.int32).clamp(0, S).contiguous()
    low = q.dtype == torch.bfloat16 and k.dtype == torch.bfloat16 and not interpreter_active()
    block_t = 16 if T <= 16 else 64
    block_s = 64
    _kernels(interpreter_active()).logits[(triton.cdiv(T, block_t), triton.cdiv(S, block_s))](
        q, w, k, nvis, out, T, H, d, S,
        q.stride(0), q.stride(1), w.stride(0), k.stride(0), out.stride(0),
        BLOCK_T=block_t, BLOCK_S=block_s, BLOCK_D=max(16, next_pow2(d)),
        OP_DTYPE=tl.bfloat16 if low else tl.float32, BF16_DOTS=mode == "bf16",
    )
    return out


# ----------------------------------------------------------------------------------------------
# SGLang's paged FP8 indexer K layout: pages [num_pages, 64, 1, 132] uint8 = per page 64 × 128
# FP8-E4M3 values, then 64 fp32 scales (one per token). A token's row s sits in logical page
# s // 64 at slot s % 64; page_table maps a query's logical pages to physical pages. Logits:
# score[b, s] = scale[s] · Σ_h w[b, h] · relu(q[b, h] · k[s]), -inf at s >= seq_len[b].
# ----------------------------------------------------------------------------------------------
IDX_PAGE, IDX_DIM = 64, 128


def pack_indexer_pages(k: torch.Tensor) -> torch.Tensor:
    """Quantize keys k [S, 128] per token (fp32 scale = amax / 448) into consecutive pages
    -> uint8 [ceil(S / 64), 64, 1, 132]."""
    if k.dim() != 2 or k.shape[1] != IDX_DIM:
        raise ValueError(f"indexer keys are [S, {IDX_DIM}], got {tuple(k.shape)}")
    S = k.shape[0]
    pages = max(1, -(-S // IDX_PAGE))
    scale = (k.float().abs().amax(-1) / 448.0).clamp_min(1e-12)  # [S]
    vals = torch.zeros(pages * IDX_PAGE, IDX_DIM, dtype=torch.uint8, device=k.device)
    vals[:S] = (k.float() / scale[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    scales = torch.zeros(pages * IDX_PAGE, dtype=torch.float32, device=k.device)
    scales[:S] = scale
    out = torch.cat([vals.view(pages, -1), scales.view(pages, IDX_PAGE).view(torch.uint8)], 1)
    return out.view(pages, IDX_PAGE, 1, IDX_DIM + 4)


def _check_paged(q_fp8, pages, weight, seq_lens, page_table, mode) -> None:
    if q_fp8.dim() != 3 or q_fp8.shape[2] != IDX_DIM or q_fp8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"q_fp8 must be [B, H, {IDX_DIM}] float8_e4m3fn")
    B, H, _ = q_fp8.shape
    if pages.dtype != torch.uint8 or pages.shape[1:] != (IDX_PAGE, 1, IDX_DIM + 4):
        raise ValueError(f"pages must be uint8 [P, {IDX_PAGE}, 1, {IDX_DIM + 4}]")
    if weight.shape != (B, H) or seq_lens.shape != (B,) or page_table.shape[0] != B:
        raise ValueError("weight must be [B, H], seq_lens [B], page_table [B, max_pages]")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def indexer_logits_paged_ref(
    q_fp8: torch.Tensor,
    pages: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int,
    *,
    mode: str = "fp32",
) -> torch.Tensor:
    """Reference (gather pages, dequantize, fp32): q_fp8 [B, H, 128], pages [P, 64, 1, 132],
    weight [B, H] fp32, seq_lens [B], page_table [B, max_pages] -> [B, max_seq_len] fp32."""
    _check_paged(q_fp8, pages, weight, seq_lens, page_table, mode)
    B = q_fp8.shape[0]
    n_pages = -(-max_seq_len // IDX_PAGE)
    flat = pages.view(pages.shape[0], -1)
    pt = page_table[:, :n_pages].long().clamp(min=0)
    pt = torch.nn.functional.pad(pt, (0, n_pages - pt.shape[1]))
    g = flat[pt]  # [B, n_pages, 8448]
    k = g[..., : IDX_PAGE * IDX_DIM].contiguous().view(torch.float8_e4m3fn).float()
    k = k.view(B, n_pages * IDX_PAGE, IDX_DIM)
    scale = g[..., IDX_PAGE * IDX_DIM :].contiguous().view(torch.float32).view(B, -1)
    dots = torch.bmm(q_fp8.float(), k.transpose(1, 2))  # [B, H, S]
    if mode == "bf16":
        dots = dots.to(torch.bfloat16).float()
    score = torch.bmm(weight.float()[:, None, :], dots.relu())[:, 0] * scale
    score = score[:, :max_seq_len]
    cols = torch.arange(max_seq_len, device=score.device)[None, :]
    return score.masked_fill(cols >= seq_lens.to(score.device).long()[:, None], float("-inf"))


@functools.cache
def _paged_kernels(interpret: bool) -> SimpleNamespace:
    install_helpers(globals(), interpret)

    @triton.jit
    def paged_kernel(
        q_ptr, pages_ptr, w_ptr, lens_ptr, pt_ptr, out_ptr,
        H, max_seq_len, n_pages, PPP, stride_qb, stride_wb, stride_pt, stride_ob,
        BLOCK_H: tl.constexpr, OP_DTYPE: tl.constexpr, BF16_DOTS: tl.constexpr,
    ):
        # program (token b, run r): logical pages [r·PPP, r·PPP + PPP), 64 keys each. Keys are
        # tl.dot's M (64 = one wgmma warp group), heads its N: the head sum is a row reduction
        # inside the MMA layout. q and w are loaded once per run; the next page's physical id
        # is loaded one iteration ahead, so the pipeliner (num_stages >= 3) keeps the next
        # pages' copies in flight while one page computes.
        b = tl.program_id(0).to(tl.int64)
        p_lo = tl.program_id(1) * PPP
        p_hi = tl.minimum(p_lo + PPP, n_pages)
        seq_len = tl.load(lens_ptr + b)
        offs_h = tl.arange(0, BLOCK_H)
        hmask = offs_h < H
        offs_d = tl.arange(0, 128)
        offs_k = tl.arange(0, 64)
        qh = tl.load(q_ptr + b * stride_qb + offs_h[:, None] * 128 + offs_d[None, :],
                     mask=hmask[:, None], other=0)
        qt = tl.trans(qh.to(tl.float8e4nv, bitcast=True).to(OP_DTYPE))  # [128, BLOCK_H]
        w = tl.load(w_ptr + b * stride_wb + offs_h, mask=hmask, other=0.0)
        pt_row = pt_ptr + b * stride_pt
        page = tl.load(pt_row + p_lo, mask=p_lo * 64 < seq_len, other=0).to(tl.int64)
        for p in range(p_lo, p_hi):
            nxt = tl.load(pt_row + p + 1, mask=(p + 1) * 64 < seq_len, other=0).to(tl.int64)
            base = pages_ptr + tl.maximum(page, 0) * 8448
            keys = p * 64 + offs_k
            kmask = keys < seq_len
            kt = tl.load(base + offs_k[:, None] * 128 + offs_d[None, :], mask=kmask[:, None],
                         other=0)
            kt = kt.to(tl.float8e4nv, bitcast=True).to(OP_DTYPE)  # [64, 128]
            scale = tl.load((base + 8192).to(tl.pointer_type(tl.float32)) + offs_k, mask=kmask,
                            other=0.0)
            dots = tl.dot(kt, qt, input_precision="ieee")  # [64 keys, BLOCK_H]
            if BF16_DOTS:
                dots = round_bf16(dots)
            acc = tl.sum(tl.maximum(dots, 0.0) * w[None, :], 1) * scale
            res = tl.where(kmask, acc, float("-inf"))
            tl.store(out_ptr + b * stride_ob + keys, res, mask=keys < max_seq_len)
            page = nxt

    return SimpleNamespace(paged=paged_kernel)


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def indexer_logits_paged(
    q_fp8: torch.Tensor,
    pages: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int,
    *,
    mode: str = "fp32",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton indexer logits over SGLang's paged FP8 K (the `fp8_paged_mqa_logits` contract).
    `mode="fp32"`: the e4m3 operands converted to bf16 (exactly) on bf16 tensor cores, fp32
    accumulation: the fp32 reference within ~1e-6. `mode="bf16"`: fp8 tensor cores (Hopper's
    fp8 MMA keeps ~14 accumulator bits, below the bf16 rounding that follows), the per-head
    dots rounded to bf16. Same numbers as `indexer_logits_paged_ref`."""
    _check_paged(q_fp8, pages, weight, seq_lens, page_table, mode)
    require_triton(q_fp8, pages, weight, seq_lens, page_table)
    B, H, _ = q_fp8.shape
    if out is None:
        out = torch.empty(B, max_seq_len, dtype=torch.float32, device=q_fp8.device)
    if B == 0 or max_seq_len == 0:
        return out
    interp = interpreter_active()
    q = q_fp8.contiguous().view(torch.uint8)
    lens = seq_lens.to(torch.int32).contiguous()
    pt = page_table.to(torch.int32).contiguous()
    w = weight.float().contiguous()
    n_pages = triton.cdiv(max_seq_len, IDX_PAGE)
    # ~4 programs of 4 warps per SM in flight; a run of pages shares one load of q and w
    ppp = max(1, triton.cdiv(B * n_pages, 4 * _sm_count(q.device)))
    grid = (B, triton.cdiv(n_pages, ppp))
    # fp32 mode: fp8 -> bf16 is exact, so bf16 tensor cores give exact products with fp32
    # accumulation (fp8 tensor cores accumulate with ~14 bits on Hopper: 1e-4 relative)
    op = tl.float32 if interp else (tl.bfloat16 if mode == "fp32" else tl.float8e4nv)
    _paged_kernels(interp).paged[grid](
        q, pages, w, lens, pt, out, H, max_seq_len, n_pages, ppp, q.stride(0), w.stride(0),
        pt.stride(0), out.stride(0), BLOCK_H=max(16, next_pow2(H)), OP_DTYPE=op,
        BF16_DOTS=mode == "bf16", num_warps=4, num_stages=3,
    )
    return out
