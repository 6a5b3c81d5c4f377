"""Shared helpers for the kernel files: is Triton usable here, and does it run interpreted?

Triton is imported under a guard so that every kernel module (and its PyTorch reference) imports
on a machine without Triton; the kernels themselves are built on first use (see `jit_helpers`).
`TRITON_INTERPRET=1` makes Triton run kernels on CPU tensors with numpy; the tests use it at
small shapes, and the kernels switch bf16 `tl.dot` operands to fp32 there because Triton 3.9's
interpreter returns garbage for bf16 dots (DESIGN §11).
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace
from typing import TYPE_CHECKING

try:  # guarded: the references and every module import without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without Triton
    triton = tl = None

if TYPE_CHECKING:
    import torch


def triton_available() -> bool:
    """True when `import triton` worked (the wrappers need it; the references do not)."""
    return triton is not None


def interpreter_active() -> bool:
    """True when Triton runs kernels in its numpy interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in {"1", "true", "yes", "on"}


def require_triton(*tensors: torch.Tensor) -> None:
    """Raise a clear error when a Triton wrapper cannot run on these tensors."""
    if not triton_available():
        raise RuntimeError(
            "Triton is not installed; use the `_ref` PyTorch reference of this op instead"
        )
    if interpreter_active():
        return
    for t in tensors:
        if t.device.type != "cuda":
            raise ValueError(
                f"Triton kernels need CUDA tensors (got {t.device}); on CPU use the `_ref` "
                "function, or set TRITON_INTERPRET=1 to run the kernel interpreted"
            )


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1): Triton block sizes must be powers of two."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@functools.cache
def jit_helpers(interpret: bool) -> SimpleNamespace:
    """Device helpers shared by the kernels, jitted in the current mode (compiled or
    interpreted: Triton fixes the mode when a function is decorated, and the two cannot call
    each other, so every kernel file builds its kernels in a cached builder keyed like this).

    `round_bf16` rounds fp32 to the nearest bf16 (ties to even). Compiled, that is the hardware
    conversion (`cvt.rn.bf16.f32` on sm_80+); Triton's interpreter does not round to nearest-even
    when it casts fp32 to bf16 or fp8, so there it is done on the bits (the same values).
    `round_e4m3` is done on the bits in both modes.
    """
    if interpret:

        @triton.jit
        def round_bf16(x):
            """fp32 -> the nearest bf16 value (ties to even), returned as fp32. Finite x."""
            b = x.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            return b.to(tl.float32, bitcast=True)

    else:

        @triton.jit
        def round_bf16(x):
            """fp32 -> the nearest bf16 value (ties to even), returned as fp32."""
            return x.to(tl.bfloat16).to(tl.float32)

    @triton.jit
    def round_e4m3(s):
        """fp32 s >= 0 -> the nearest FP8-E4M3 value (ties to even, saturating at 448), as fp32.

        Adding 2^(e+20) puts s's E4M3 quantum 2^(e-3) (e = max(exponent, -6), the subnormal
        range below 2^-6) at the last fp32 mantissa bit, so the fp32 add rounds for us.
        """
        s = tl.minimum(s, 448.0)
        e = ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        e = tl.maximum(e, -6)
        c = ((e + 20 + 127) << 23).to(tl.float32, bitcast=True)
        return (s + c) - c

    return SimpleNamespace(round_bf16=round_bf16, round_e4m3=round_e4m3)


def install_helpers(module_globals: dict, interpret: bool) -> None:
    """Bind the helpers as globals of a kernel module: Triton's interpreter resolves a kernel's
    names in its module globals only (not in closures), and the compiler does so as well."""
    module_globals.update(vars(jit_helpers(interpret)))
