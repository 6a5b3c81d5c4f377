"""mHC mixes: `m = (x · fnᵀ) · rsqrt(mean(x², -1) + eps)` (patch 1 site).

x is the flattened residual state [T, n·D] (n = 4 streams), fn the mixing projection [M, n·D]
fp32 (M = (2 + n)·n = 24 at a layer's hc_pre, n = 4 at hc_head). The rsqrt factor is an
unweighted RMSNorm folded in after the GEMM. Output [T, M] fp32.

Rounding, per mode (what the reference does, step by step):
- `fp32`: x and fn upcast to fp32, product accumulated in fp32, fp32 rsqrt factor, fp32 out.
  This is SGLang's torch `hc_pre` path on SM120.
- `bf16` (the patch): x and fn are rounded to bf16 (round-to-nearest-even), their product is
  accumulated in fp32 (bf16×bf16 products are exact in fp32), the [T, M] product is rounded to
  bf16 (the GEMM's bf16 output), then multiplied in fp32 by the rsqrt factor, which is computed
  in fp32 from the un-rounded x (SGLang takes the norm from x, not from the GEMM operands).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ._triton import install_helpers, interpreter_active, next_pow2, require_triton

try:  # guarded: the reference imports without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = tl = None

MODES = ("fp32", "bf16")
REF_MODES = (*MODES, "tf32")  # the PyTorch reference also models TF32 operands


def check_mhc_args(x: torch.Tensor, fn: torch.Tensor, eps: float, mode: str,
                   modes: tuple[str, ...] = MODES) -> None:
    """Validate shapes and options shared by the reference and the Triton wrapper."""
    if x.dim() != 2:
        raise ValueError(f"x must be [T, n*D], got shape {tuple(x.shape)}")
    if fn.dim() != 2 or fn.shape[1] != x.shape[1]:
        raise ValueError(f"fn must be [M, {x.shape[1]}], got {tuple(fn.shape)}")
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if mode not in modes:
        raise ValueError(f"mode must be one of {modes}, got {mode!r}")


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 -> the nearest TF32 value (13 low mantissa bits cleared, ties to even), as fp32."""
    bits = t.contiguous().view(torch.int32)
    lsb = (bits >> 13) & 1
    rounded = (bits + 0xFFF + lsb) & ~0x1FFF
    return torch.where(torch.isfinite(t), rounded.view(torch.float32), t)


def mhc_mixes_ref(
    x: torch.Tensor, fn: torch.Tensor, eps: float, *, mode: str = "fp32"
) -> torch.Tensor:
    """PyTorch reference. x: [T, n·D] (any float dtype), fn: [M, n·D] -> [T, M] fp32.
    `tf32` (reference only: SGLang's FlashInfer mHC as the embedded engine models it) rounds
    both operands to TF32 (10-bit mantissa, round to nearest even) before an fp32 GEMM."""
    check_mhc_args(x, fn, eps, mode, REF_MODES)
    xf = x.float()
    rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)  # [T, 1], fp32 from fp32 x
    if mode == "fp32":
        prod = xf @ fn.float().T
    elif mode == "tf32":
        prod = round_tf32(xf) @ round_tf32(fn.float()).T
    else:
        xb = xf.to(torch.bfloat16).float()
        fb = fn.float().to(torch.bfloat16).float()
        prod = (xb @ fb.T).to(torch.bfloat16).float()  # fp32 accumulate, bf16 output
    return prod * rs


SPLIT_KERNELS = ("tf32", "fma")


def mhc_mixes_split_ref(
    x: torch.Tensor, fn: torch.Tensor, eps: float, *, n_splits: int, kernel: str, hc_mult: int
) -> torch.Tensor:
    """The pre-norm GEMM as SGLang's split-K kernels fold it (`reference.dispatch.MhcPrePlan`).
    x: [T, n·D], fn: [M, n·D] -> [T, M] fp32.

    Each split s gives a partial product P_s [T, M] and a partial sum of squares S_s [T] (fp32,
    from the unrounded x); the partials are added in split order as SGLang's big-fuse kernel
    does (`mixes += partial[s]` for s = 0..n_splits-1), then mixes = ΣP · rsqrt(ΣS / n·D + eps).
    - `tf32`: DeepGEMM `tf32_hc_prenorm_gemm`: K = n·D cut into n_splits contiguous slices,
      fn rounded to TF32 (`round_tf32`) for the tensor-core MMA; x is bf16 on SGLang, exact in
      TF32, so the engine's fp32 x is used as it is.
    - `fma`: the TileLang scalar-FMA kernel of `mhc_fused_post_pre`: each stream's D cut into
      n_splits slices, a split covering that slice of every stream; fp32 operands."""
    check_mhc_args(x, fn, eps, "fp32")
    if kernel not in SPLIT_KERNELS:
        raise ValueError(f"kernel must be one of {SPLIT_KERNELS}, got {kernel!r}")
    if n_splits < 1 or x.shape[1] % hc_mult:
        raise ValueError(f"need n_splits >= 1 and n·D divisible by hc_mult={hc_mult}")
    xf, ff = x.float(), fn.float()
    T, K = xf.shape
    M = ff.shape[0]
    if kernel == "tf32":  # K cut into n_splits contiguous slices (zero-padded: exact)
        step = -(-K // n_splits)
        pad = step * n_splits - K
        x_raw = (F.pad(xf, (0, pad)) if pad else xf).view(T, n_splits, step)
        x_op = x_raw  # bf16 on SGLang, exact in TF32; the engine's fp32 x is taken as it is
        f_op = round_tf32(F.pad(ff, (0, pad)) if pad else ff).view(M, n_splits, step)
        sq_parts = x_raw.square().sum(-1)  # [T, S]
    else:  # each stream's D cut into n_splits slices; a split takes its slice of every stream
        D = K // hc_mult
        step = -(-D // n_splits)
        pad = step * n_splits - D
        x3 = xf.view(T, hc_mult, D)
        x_raw = (F.pad(x3, (0, pad)) if pad else x3).view(T, hc_mult, n_splits, step)
        x_op = x_raw.transpose(1, 2).reshape(T, n_splits, hc_mult * step)
        f_op = F.pad(ff.view(M, hc_mult, D), (0, pad)).view(M, hc_mult, n_splits, step)
        f_op = f_op.transpose(1, 2).reshape(M, n_splits, hc_mult * step)
        sq_parts = x_raw.square().sum((1, 3))  # [T, S]
    parts = torch.einsum("tsk,msk->stm", x_op, f_op)  # [S, T, M]: one fp32 partial per split
    prod, sq = parts[0], sq_parts[:, 0]
    for i in range(1, n_splits):  # split order, as the big-fuse kernel adds them
        prod, sq = prod + parts[i], sq + sq_parts[:, i]
    rs = torch.rsqrt(sq / K + eps)[:, None]
    return prod * rs


# ----------------------------------------------------------------------------------------------
# Triton: one pass over x (bandwidth-bound GEMV-like reduction) fused with the sum of squares;
# grid (token blocks, K splits); with K splits a small second kernel adds the partials.
# ----------------------------------------------------------------------------------------------
round_bf16 = None  # a jitted helper, bound by install_helpers() when the kernels are built


@functools.cache
def _kernels(interpret: bool) -> SimpleNamespace:
    """Build the jitted kernels once per mode (see `_triton.jit_helpers`)."""
    install_helpers(globals(), interpret)

    @triton.jit
    def mixes_kernel(
        x_ptr, fn_ptr, out_ptr, part_ptr, sq_ptr,
        T, M, KD, K_PER_SPLIT, eps,
        stride_xt, stride_fm, stride_ot,
        BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
        DOTS: tl.constexpr, ROUND_OPS: tl.constexpr, ROUND_OUT: tl.constexpr,
        FUSED: tl.constexpr,
    ):
        # program (token block, K split); x [BLOCK_T, BLOCK_K] is the MMA's A (tokens = M, one
        # or two wgmma warp groups), fnᵀ [BLOCK_K, BLOCK_M] its B. DOTS (compiled):
        #   "bf16"   the patch: x and fn as bf16 operands (x straight from its load when bf16)
        #   "bf16x3" fp32 mode with bf16 x: fn = f1 + f2 + f3 in bf16 (24 bits), three bf16
        #            MMAs with exact products - fp32 accuracy at 3 bf16 MMAs
        #   "tf32x3" fp32 mode with fp32 x; "ieee" the interpreter (ROUND_OPS: bf16 values)
        pid_t = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_m = tl.arange(0, BLOCK_M)
        tmask = offs_t < T
        mmask = offs_m < M
        acc = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32)
        ss = tl.zeros([BLOCK_T], dtype=tl.float32)
        k_lo = pid_k * K_PER_SPLIT
        for k0 in range(k_lo, k_lo + K_PER_SPLIT, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < KD
            x = tl.load(x_ptr + offs_t[:, None].to(tl.int64) * stride_xt + offs_k[None, :],
                        mask=tmask[:, None] & kmask[None, :], other=0.0)
            f = tl.load(fn_ptr + offs_m[:, None] * stride_fm + offs_k[None, :],
                        mask=mmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
            xf = x.to(tl.float32)
            ss += tl.sum(xf * xf, 1)  # the norm uses the unrounded x
            if DOTS == "bf16":
                acc = tl.dot(x.to(tl.bfloat16), tl.trans(f.to(tl.bfloat16)), acc)
            elif DOTS == "bf16x3":
                f1 = f.to(tl.bfloat16)
                r = f - f1.to(tl.float32)
                f2 = r.to(tl.bfloat16)
                f3 = (r - f2.to(tl.float32)).to(tl.bfloat16)
                acc = tl.dot(x, tl.trans(f1), acc)
                acc = tl.dot(x, tl.trans(f2), acc)
                acc = tl.dot(x, tl.trans(f3), acc)
            elif DOTS == "tf32x3":
                acc = tl.dot(xf, tl.trans(f), acc, input_precision="tf32x3")
            else:
                if ROUND_OPS:
                    xf = round_bf16(xf)
                    f = round_bf16(f)
                acc = tl.dot(xf, tl.trans(f), acc, input_precision="ieee")
        if FUSED:
            if ROUND_OUT:  # the bf16 GEMM output
                acc = round_bf16(acc)
            out = acc * tl.math.rsqrt(ss / KD + eps)[:, None]
            tl.store(out_ptr + offs_t[:, None] * stride_ot + offs_m[None, :], out,
                     mask=tmask[:, None] & mmask[None, :])
        else:  # partials [KSPLIT, T, BLOCK_M] and [KSPLIT, T]
            base = pid_k.to(tl.int64) * T + offs_t
            tl.store(part_ptr + base[:, None] * BLOCK_M + offs_m[None, :], acc, mask=tmask[:, None])
            tl.store(sq_ptr + base, ss, mask=tmask)

    @triton.jit
    def reduce_kernel(
        part_ptr, sq_ptr, out_ptr, T, M, KD, KSPLIT, eps, stride_ot,
        BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, ROUND_OUT: tl.constexpr,
    ):
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_m = tl.arange(0, BLOCK_M)
        tmask = offs_t < T
        acc = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32)
        ss = tl.zeros([BLOCK_T], dtype=tl.float32)
        for k in range(KSPLIT):
            base = k * T + offs_t.to(tl.int64)
            acc += tl.load(part_ptr + base[:, None] * BLOCK_M + offs_m[None, :],
                           mask=tmask[:, None], other=0.0)
            ss += tl.load(sq_ptr + base, mask=tmask, other=0.0)
        if ROUND_OUT:  # the bf16 GEMM output
            acc = round_bf16(acc)
        out = acc * tl.math.rsqrt(ss / KD + eps)[:, None]
        tl.store(out_ptr + offs_t[:, None] * stride_ot + offs_m[None, :], out,
                 mask=tmask[:, None] & (offs_m < M)[None, :])

    return SimpleNamespace(mixes=mixes_kernel, reduce=reduce_kernel)


@functools.cache
def _small_smem(device: torch.device) -> bool:
    """SM86/89/120: ~100 KB of shared memory per block (the H200: 227 KB)."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) in {(8, 6), (8, 7), (8, 9), (12, 0), (12, 1)}


def mhc_mixes(
    x: torch.Tensor,
    fn: torch.Tensor,
    eps: float,
    *,
    mode: str = "fp32",
    out: torch.Tensor | None = None,
    k_splits: int | None = None,
) -> torch.Tensor:
    """Triton mHC mixes, same contract as `mhc_mixes_ref` (CUDA tensors, or CPU tensors under
    TRITON_INTERPRET=1). On the GPU the fp32 mode runs on tensor cores at fp32 accuracy: with
    bf16 x, fn split into three bf16 parts (three exact-product bf16 MMAs); with fp32 x, 3 TF32
    products (tf32x3). `k_splits` splits the n·D reduction over
    programs (default: enough programs to fill the GPU when T is small); `out` (optional,
    [T, M] fp32) gets the result."""
    check_mhc_args(x, fn, eps, mode)
    require_triton(x, fn)
    T, KD = x.shape
    M = fn.shape[0]
    if out is None:
        out = torch.empty(T, M, dtype=torch.float32, device=x.device)
    elif out.shape != (T, M) or out.dtype != torch.float32 or out.stride(-1) != 1:
        raise ValueError(f"out must be a [{T}, {M}] fp32 tensor with unit last stride")
    if T == 0:
        return out
    x, fn = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, fn))
    interp = interpreter_active()
    bf16 = mode == "bf16"
    if interp:
        dots = "ieee"
    elif bf16:
        dots = "bf16"
    else:
        dots = "bf16x3" if x.dtype == torch.bfloat16 else "tf32x3"
    # 128 tokens × 128 of n·D per step on 8 warps (x 32 KB + fn 16 KB per stage, 3 stages:
    # 106-123 KB; GPUs with ~100 KB of shared memory per block take the 64 × 64 tiles)
    big = T > 64 and not interp and not _small_smem(x.device)
    block_t, block_k = (128, 128) if big else ((16 if T <= 16 else 64), 64)
    block_m = max(16, next_pow2(M))
    n_tblocks = triton.cdiv(T, block_t)
    if k_splits is None:  # ~2 programs per SM (132 on an H200)
        k_splits = 1 if interp else max(1, min(triton.cdiv(KD, 1024), 264 // n_tblocks))
    k_per = triton.cdiv(triton.cdiv(KD, k_splits), block_k) * block_k
    k_splits = triton.cdiv(KD, k_per)
    fused = k_splits == 1
    part = out if fused else torch.empty(k_splits, T, block_m, device=x.device)
    sq = out if fused else torch.empty(k_splits, T, device=x.device)
    ks = _kernels(interp)
    ks.mixes[(n_tblocks, k_splits)](
        x, fn, out, part, sq, T, M, KD, k_per, float(eps),
        x.stride(0), fn.stride(0), out.stride(0),
        BLOCK_T=block_t, BLOCK_M=block_m, BLOCK_K=block_k, DOTS=dots, ROUND_OPS=bf16 and interp,
        ROUND_OUT=bf16, FUSED=fused, num_warps=8 if big else 4, num_stages=3,
    )
    if not fused:
        ks.reduce[(n_tblocks,)](
            part, sq, out, T, M, KD, k_splits, float(eps), out.stride(0),
            BLOCK_T=block_t, BLOCK_M=block_m, ROUND_OUT=bf16,
        )
    return out
