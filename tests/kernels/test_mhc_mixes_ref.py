"""mhc_mixes_ref against a float64 formula and a step-by-step bf16 emulation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.kernels.mhc_mixes import mhc_mixes_ref


def make_inputs(seed: int, T: int, ND: int, M: int, x_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, ND, generator=g) * 3).to(x_dtype)
    fn = torch.randn(M, ND, generator=g) * ND**-0.5
    return x, fn


def formula64(x, fn, eps) -> torch.Tensor:
    x64, f64 = x.double(), fn.double()
    return (x64 @ f64.T) / torch.sqrt((x64**2).mean(-1, keepdim=True) + eps)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), T=st.integers(1, 20), ND=st.sampled_from([16, 64, 1024]),
       M=st.sampled_from([4, 24]), bf16_x=st.booleans())
def test_fp32_matches_formula(seed, T, ND, M, bf16_x):
    x, fn = make_inputs(seed, T, ND, M, torch.bfloat16 if bf16_x else torch.float32)
    out = mhc_mixes_ref(x, fn, 1e-6)
    assert out.dtype == torch.float32 and out.shape == (T, M)
    assert torch.allclose(out.double(), formula64(x, fn, 1e-6), rtol=1e-4, atol=1e-5)


def test_bf16_mode_is_the_documented_rounding():
    x, fn = make_inputs(1, 32, 4 * 256, 24)
    out = mhc_mixes_ref(x, fn, 1e-6, mode="bf16")
    # independent emulation: operands to bf16, product exact in float64, product to bf16,
    # norm factor from the unrounded x
    prod = (x.bfloat16().double() @ fn.bfloat16().double().T).to(torch.bfloat16).double()
    ref = prod / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-6)
    f = mhc_mixes_ref(x, fn, 1e-6, mode="fp32")
    err = float((out - f).norm() / f.norm())
    assert 1e-3 < err < 1e-2, err


def test_zero_rows_and_eps():
    x, fn = make_inputs(2, 3, 64, 4)
    x[1] = 0
    for mode in ("fp32", "bf16"):
        out = mhc_mixes_ref(x, fn, 1e-6, mode=mode)
        assert torch.isfinite(out).all() and torch.equal(out[1], torch.zeros(4))


@pytest.mark.parametrize("bad", ["shape", "mode"])
def test_bad_arguments_raise(bad):
    x, fn = make_inputs(0, 2, 32, 4)
    with pytest.raises(ValueError):
        if bad == "shape":
            mhc_mixes_ref(x, fn[:, :16], 1e-6)
        else:
            mhc_mixes_ref(x, fn, 1e-6, mode="fp8")
