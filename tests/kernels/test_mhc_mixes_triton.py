"""Triton mHC mixes against `mhc_mixes_ref` (interpreter on CPU, native on CUDA), with
NaN-poisoned outputs, with and without the split-K reduction."""

from __future__ import annotations

import pytest
import torch

from dsv4bisect.kernels.mhc_mixes import mhc_mixes, mhc_mixes_ref

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def inputs(seed, T, KD, M, dev, x_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, KD, generator=g) * 2).to(x_dtype)
    fn = torch.randn(M, KD, generator=g) * KD**-0.5
    return x.to(dev), fn.to(dev)


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def run(x, fn, mode, k_splits=None):
    out = torch.full((x.shape[0], fn.shape[0]), float("nan"), device=x.device)
    assert mhc_mixes(x, fn, 1e-6, mode=mode, out=out, k_splits=k_splits) is out
    assert not torch.isnan(out).any()
    return out.cpu()


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize("T,KD,M,k_splits", [(5, 256, 24, None), (37, 320, 4, None),
                                             (20, 1024, 24, 3), (1, 1000, 24, 4)])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(dev, mode, T, KD, M, k_splits, x_dtype):
    x, fn = inputs(T + KD, T, KD, M, dev, x_dtype)
    ref = mhc_mixes_ref(x.cpu(), fn.cpu(), 1e-6, mode=mode)
    # bf16: fp32 summation order can move a product across a bf16 rounding edge (rare)
    assert rel(run(x, fn, mode, k_splits), ref) < (1e-5 if mode == "fp32" else 1e-3)


def test_zero_row(dev):
    x, fn = inputs(0, 3, 64, 4, dev)
    x[1] = 0
    out = run(x, fn, "bf16")
    assert torch.equal(out[1], torch.zeros(4))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("T", [1, 64, 4096])
def test_gpu_flash_shapes(T):
    """Flash hc_pre: x [T, 4·4096] bf16, hc_fn [24, 16384] fp32."""
    x, fn = inputs(T, T, 16384, 24, "cuda", torch.bfloat16)
    ref = mhc_mixes_ref(x.cpu(), fn.cpu(), 1e-6)
    assert rel(run(x, fn, "fp32"), ref) < 1e-5
    assert 1e-3 < rel(run(x, fn, "bf16"), ref) < 1e-2
