"""NVFP4: 4-bit E2M1 values, one FP8-E4M3 scale per 16 values, one fp32 global scale (patch 5).

Format (NVIDIA NVFP4 as used by ModelOpt checkpoints; E2M1 as in the OCP MX spec §5.3.3):
- E2M1 code = sign bit (bit 3) | magnitude code (bits 0-2) for {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
  Two codes per byte: element 2i in the low nibble, element 2i+1 in the high nibble (the
  packing of `torch.float4_e2m1fn_x2`).
- Blocks of 16 consecutive values along the last dim. The block scale is
  `amax(block) / 6 / global_scale`, rounded to E4M3 (`torch.float8_e4m3fn`, max 448).
- `global_scale` (fp32) defaults to `amax(x) / (6 · 448)`, so the largest block scale is 448.
- Dequantized value = E2M1 value · float(block scale) · global_scale.
- Quantization: v = x / (block scale · global_scale), rounded to the nearest E2M1 value with
  ties to the even code, saturating at ±6. A block whose scale is 0 (zero block, zero tensor,
  or a scale that underflows E4M3) quantizes to 0.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from ._triton import install_helpers, interpreter_active, require_triton

try:  # guarded: the references import without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = tl = None

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# E2M1 magnitude code c (0..7) -> value
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring grid values, and whether a tie rounds up (to the even code).
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_UP = (False, True, False, True, False, True, False)


@dataclass(frozen=True)
class NVFP4Tensor:
    """A quantized tensor. codes: [..., K/2] uint8; scales: [..., K/16] float8_e4m3fn;
    global_scale: fp32 scalar tensor (or [..., 1], one per row, when given so);
    shape: the original shape [..., K]."""

    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    shape: torch.Size


def _check_last_dim(x: torch.Tensor) -> None:
    if x.dim() == 0 or x.shape[-1] % BLOCK != 0:
        k = x.shape[-1] if x.dim() else "a scalar"
        raise ValueError(f"NVFP4 needs a last dim that is a multiple of {BLOCK}, got {k}")


def default_global_scale(x: torch.Tensor) -> torch.Tensor:
    """amax(x) / (6 · 448) in fp32 (0 for an all-zero or empty tensor)."""
    amax = x.float().abs().amax() if x.numel() else torch.zeros((), device=x.device)
    return (amax / (E2M1_MAX * E4M3_MAX)).to(torch.float32)


def _as_global_scale(global_scale: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
    """A scalar, or one scale per row ([..., 1], e.g. dynamic per-token activation scales)."""
    g = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
    if g.numel() == 1:
        return g.reshape(())
    if g.shape != (*x.shape[:-1], 1):
        raise ValueError(
            f"global_scale must be a scalar or [..., 1] = {(*x.shape[:-1], 1)}, "
            f"got {tuple(g.shape)}"
        )
    return g


def e2m1_magnitude_code(a: torch.Tensor) -> torch.Tensor:
    """Round |values| (already scaled, >= 0) to the E2M1 grid: code 0..7, ties to even,
    saturating at 6. Returns uint8 of a's shape."""
    code = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for mid, up in zip(_MIDPOINTS, _TIE_UP):
        code += (a >= mid if up else a > mid).to(torch.uint8)
    return code


def nvfp4_quantize(
    x: torch.Tensor, *, global_scale: torch.Tensor | float | None = None
) -> NVFP4Tensor:
    """Quantize x [..., K] (K % 16 == 0) to NVFP4."""
    _check_last_dim(x)
    xf = x.float()
    g = default_global_scale(xf) if global_scale is None else _as_global_scale(global_scale, x)
    blocks = xf.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)  # [..., K/16, 16]
    amax = blocks.abs().amax(-1)  # [..., K/16]
    raw = torch.where(g > 0, amax / E2M1_MAX / torch.where(g > 0, g, 1.0), 0.0)
    scales = raw.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = scales.float() * g  # [..., K/16]; 0 -> the block quantizes to 0
    ok = denom > 0
    v = torch.where(ok[..., None], blocks / torch.where(ok, denom, 1.0)[..., None], 0.0)
    code = e2m1_magnitude_code(v.abs()) | ((v < 0).to(torch.uint8) << 3)
    code = code.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    packed = code[..., 0] | (code[..., 1] << 4)  # element 2i low nibble, 2i+1 high nibble
    return NVFP4Tensor(packed.contiguous(), scales, g.clone(), x.shape)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8 0..15) -> fp32 values."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), device=codes.device)
    # index_select, not lut[codes.long()]: the same gather, but advanced indexing takes ~20 ms
    # per 32k codes on CPU (torch 2.13) against ~0.05 ms, and loading the shipped checkpoint
    # decodes every routed expert (docs/performance.md, "doctor")
    return lut.index_select(0, codes.reshape(-1).long()).reshape(codes.shape)


def nvfp4_dequantize(t: NVFP4Tensor) -> torch.Tensor:
    """NVFP4Tensor -> fp32 tensor of t.shape."""
    lo, hi = t.codes & 0x0F, t.codes >> 4
    vals = e2m1_decode(torch.stack((lo, hi), dim=-1)).reshape(*t.shape[:-1], -1, BLOCK)
    out = vals * (t.scales.float() * t.global_scale)[..., None]
    return out.reshape(t.shape)


def nvfp4_fake_quant(
    x: torch.Tensor, *, global_scale: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Quantize to NVFP4 and back: fp32 of x's shape with NVFP4's rounding error."""
    return nvfp4_dequantize(nvfp4_quantize(x, global_scale=global_scale))


# The `_ref` names of the file convention (the references above are the public API).
nvfp4_quantize_ref = nvfp4_quantize
nvfp4_dequantize_ref = nvfp4_dequantize
nvfp4_fake_quant_ref = nvfp4_fake_quant


# ----------------------------------------------------------------------------------------------
# Triton: one program per BLOCK_G blocks of 16; even and odd elements are loaded as two [G, 8]
# tiles so that each byte's two codes come from the same position of the two tiles.
# ----------------------------------------------------------------------------------------------
# jitted helpers, bound as module globals when the kernels are built
round_e4m3 = round_bf16 = _e2m1_code = _e2m1_value = None
_BLOCK_G = 64


@functools.cache
def _kernels(interpret: bool) -> SimpleNamespace:
    """Build the jitted kernels once per mode (see `_triton.jit_helpers`)."""
    install_helpers(globals(), interpret)
    _jit_codecs()

    @triton.jit
    def quantize_kernel(
        x_ptr, g_ptr, codes_ptr, scales_ptr, n_blocks, blocks_per_row, g_row_stride,
        BLOCK_G: tl.constexpr,
    ):
        offs_g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
        gmask = offs_g < n_blocks
        offs_e = tl.arange(0, 8)
        base = offs_g[:, None] * 16 + 2 * offs_e[None, :]
        xe = tl.load(x_ptr + base, mask=gmask[:, None], other=0.0).to(tl.float32)
        xo = tl.load(x_ptr + base + 1, mask=gmask[:, None], other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(xe), 1), tl.max(tl.abs(xo), 1))  # [BLOCK_G]
        g = tl.load(g_ptr + (offs_g // blocks_per_row) * g_row_stride, mask=gmask, other=0.0)
        g_div = tl.where(g > 0, g, 1.0)
        raw = tl.where(g > 0, tl.math.div_rn(tl.math.div_rn(amax, 6.0), g_div), 0.0)
        scale = round_e4m3(raw)  # E4M3 value as fp32 (saturates at 448)
        tl.store(scales_ptr + offs_g, scale.to(tl.float8e4nv), mask=gmask)
        denom = scale * g
        ok = denom > 0
        d_div = tl.broadcast_to(tl.where(ok, denom, 1.0)[:, None], xe.shape)
        ve = tl.where(ok[:, None], tl.math.div_rn(xe, d_div), 0.0)
        vo = tl.where(ok[:, None], tl.math.div_rn(xo, d_div), 0.0)
        byte = _e2m1_code(ve) | (_e2m1_code(vo) << 4)
        tl.store(codes_ptr + offs_g[:, None] * 8 + offs_e[None, :], byte.to(tl.uint8),
                 mask=gmask[:, None])

    @triton.jit
    def dequantize_kernel(
        codes_ptr, scales_ptr, g_ptr, out_ptr, n_blocks, blocks_per_row, g_row_stride,
        BLOCK_G: tl.constexpr,
    ):
        offs_g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
        gmask = offs_g < n_blocks
        offs_e = tl.arange(0, 8)
        byte = tl.load(codes_ptr + offs_g[:, None] * 8 + offs_e[None, :], mask=gmask[:, None],
                       other=0).to(tl.int32)
        s = tl.load(scales_ptr + offs_g, mask=gmask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + (offs_g // blocks_per_row) * g_row_stride, mask=gmask, other=0.0)
        scale = (s * g)[:, None]
        base = offs_g[:, None] * 16 + 2 * offs_e[None, :]
        tl.store(out_ptr + base, _e2m1_value(byte & 15) * scale, mask=gmask[:, None])
        tl.store(out_ptr + base + 1, _e2m1_value(byte >> 4) * scale, mask=gmask[:, None])

    @triton.jit
    def linear_kernel(
        x_ptr, codes_ptr, scales_ptr, g_ptr, out_ptr, T, N, K, stride_xt, stride_ot, g_stride,
        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        OP_DTYPE: tl.constexpr,
    ):
        # out[T, N] = (bf16 x) · (E2M1 · E4M3)ᵀ · global: the weight tile is dequantized in
        # registers (exact in bf16) and fed to a bf16 tensor-core dot, fp32 accumulation.
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        tmask = offs_t < T
        nmask = offs_n < N
        rows_n = offs_n.to(tl.int64)[:, None]
        acc = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt + offs_k[None, :],
                        mask=tmask[:, None], other=0.0).to(tl.float32)
            x = round_bf16(x)
            c = tl.load(codes_ptr + rows_n * (K // 2) + k0 // 2
                        + tl.arange(0, BLOCK_K // 2)[None, :], mask=nmask[:, None],
                        other=0).to(tl.int32)
            w = tl.join(_e2m1_value(c & 15), _e2m1_value(c >> 4)).reshape(BLOCK_N, BLOCK_K)
            sc = tl.load(scales_ptr + rows_n * (K // 16) + k0 // 16
                         + tl.arange(0, BLOCK_K // 16)[None, :], mask=nmask[:, None], other=0.0)
            w = w.reshape(BLOCK_N, BLOCK_K // 16, 16) * sc.to(tl.float32)[:, :, None]
            w = w.reshape(BLOCK_N, BLOCK_K)
            acc += tl.dot(x.to(OP_DTYPE), tl.trans(w.to(OP_DTYPE)), input_precision="ieee")
        g = tl.load(g_ptr + offs_n * g_stride, mask=nmask, other=0.0)
        tl.store(out_ptr + offs_t.to(tl.int64)[:, None] * stride_ot + offs_n[None, :],
                 acc * g[None, :], mask=tmask[:, None] & nmask[None, :])

    return SimpleNamespace(quantize=quantize_kernel, dequantize=dequantize_kernel,
                           linear=linear_kernel)


def _jit_codecs() -> None:
    """E2M1 encode/decode device functions, bound as module globals (see `_kernels`)."""

    def e2m1_code(v):
        # nearest E2M1 code of v (ties to the even code, saturating at ±6) as int32 0..15
        a = tl.abs(v)
        c = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
        c += (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
        c += (a > 5.0).to(tl.int32)
        return c | ((v < 0).to(tl.int32) << 3)

    def e2m1_value(c):
        # E2M1 code (int32 0..15) -> value: e = 0 subnormal (0, 0.5), else 2^(e-1)·(1 + m/2)
        e = (c >> 1) & 3
        m = (c & 1).to(tl.float32)
        pow2 = tl.where(e == 1, 1.0, tl.where(e == 2, 2.0, 4.0))
        mag = tl.where(e == 0, 0.5 * m, pow2 * (1.0 + 0.5 * m))
        return tl.where((c & 8) != 0, -mag, mag)

    globals()["_e2m1_code"] = triton.jit(e2m1_code)
    globals()["_e2m1_value"] = triton.jit(e2m1_value)


def _launch_args(shape: torch.Size, g: torch.Tensor) -> tuple[int, int, int, tuple[int]]:
    n_blocks = 1
    for n in shape:
        n_blocks *= n
    n_blocks //= BLOCK
    per_row = shape[-1] // BLOCK
    return n_blocks, per_row, (0 if g.dim() == 0 else 1), (triton.cdiv(n_blocks, _BLOCK_G),)


def nvfp4_quantize_triton(
    x: torch.Tensor, *, global_scale: torch.Tensor | float | None = None
) -> NVFP4Tensor:
    """Triton `nvfp4_quantize` (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1):
    the same codes and scales as the reference, bit for bit."""
    _check_last_dim(x)
    require_triton(x)
    x = x.contiguous()
    g = default_global_scale(x) if global_scale is None else _as_global_scale(global_scale, x)
    g = g.contiguous()
    codes = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(*x.shape[:-1], x.shape[-1] // BLOCK, dtype=torch.float8_e4m3fn,
                         device=x.device)
    n_blocks, per_row, g_stride, grid = _launch_args(x.shape, g)
    if n_blocks:
        _kernels(interpreter_active()).quantize[grid](
            x, g, codes, scales, n_blocks, per_row, g_stride, BLOCK_G=_BLOCK_G
        )
    return NVFP4Tensor(codes, scales, g.clone(), x.shape)


def nvfp4_dequantize_triton(t: NVFP4Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton `nvfp4_dequantize`; `out` (optional, fp32 of t.shape, contiguous)."""
    require_triton(t.codes)
    if out is None:
        out = torch.empty(t.shape, dtype=torch.float32, device=t.codes.device)
    elif out.shape != t.shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous fp32 tensor of shape {tuple(t.shape)}")
    n_blocks, per_row, g_stride, grid = _launch_args(t.shape, t.global_scale)
    if n_blocks:
        _kernels(interpreter_active()).dequantize[grid](
            t.codes.contiguous(), t.scales.contiguous(), t.global_scale.contiguous(), out,
            n_blocks, per_row, g_stride, BLOCK_G=_BLOCK_G,
        )
    return out


def nvfp4_fake_quant_triton(
    x: torch.Tensor, *, global_scale: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Triton `nvfp4_fake_quant`: quantize and dequantize on the device."""
    return nvfp4_dequantize_triton(nvfp4_quantize_triton(x, global_scale=global_scale))


def _check_linear(x: torch.Tensor, w: NVFP4Tensor) -> tuple[int, int, int]:
    if x.dim() != 2 or len(w.shape) != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x [T, K] and w [N, K] needed, got {tuple(x.shape)}, {tuple(w.shape)}")
    if w.global_scale.numel() not in (1, w.shape[0]):
        raise ValueError("the weight's global scale must be a scalar or one per output row")
    return x.shape[0], w.shape[0], x.shape[1]


def nvfp4_linear_ref(x: torch.Tensor, w: NVFP4Tensor) -> torch.Tensor:
    """Dequantize-then-bf16 GEMM reference: x [T, K] (rounded to bf16) @ W [N, K]ᵀ -> [T, N]
    fp32, with W = E2M1 · E4M3 (exact in bf16) and the global scale applied to the output."""
    _check_linear(x, w)
    lo, hi = w.codes & 0x0F, w.codes >> 4
    vals = e2m1_decode(torch.stack((lo, hi), dim=-1)).reshape(w.shape[0], -1, BLOCK)
    wq = (vals * w.scales.float()[..., None]).reshape(w.shape)
    return (x.to(torch.bfloat16).float() @ wq.T) * w.global_scale.float().reshape(1, -1)


def nvfp4_linear(
    x: torch.Tensor, w: NVFP4Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Triton NVFP4 expert GEMM (Hopper has no FP4 tensor cores: the weights are dequantized in
    registers and multiplied on bf16 tensor cores). Same contract as `nvfp4_linear_ref`."""
    T, N, K = _check_linear(x, w)
    require_triton(x, w.codes)
    if out is None:
        out = torch.empty(T, N, dtype=torch.float32, device=x.device)
    if T == 0 or N == 0:
        return out
    interp = interpreter_active()
    x = x if x.stride(-1) == 1 else x.contiguous()
    g = w.global_scale.float().reshape(-1).contiguous()
    block_t = 16 if T <= 16 else (64 if T <= 64 else 128)
    block_k = 64 if K % 64 == 0 else 16
    grid = (triton.cdiv(T, block_t), triton.cdiv(N, 64))
    _kernels(interp).linear[grid](
        x, w.codes.contiguous(), w.scales.contiguous(), g, out, T, N, K, x.stride(0),
        out.stride(0), 0 if g.numel() == 1 else 1, BLOCK_T=block_t, BLOCK_N=64,
        BLOCK_K=block_k, OP_DTYPE=tl.float32 if interp else tl.bfloat16,
    )
    return out
