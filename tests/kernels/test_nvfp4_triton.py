"""Triton NVFP4 quantize/dequantize against the reference: the same bytes, bit for bit
(interpreter on CPU, native on CUDA), with NaN-poisoned outputs."""

from __future__ import annotations

import pytest
import torch

from dsv4bisect.kernels.nvfp4 import (
    nvfp4_dequantize,
    nvfp4_dequantize_triton,
    nvfp4_fake_quant_triton,
    nvfp4_quantize,
    nvfp4_quantize_triton,
)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def sample(seed, shape, dev, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 2)
    x[..., :16] = 0  # a zero block in every row
    return x.to(dtype).to(dev)


def same(a, b) -> bool:
    return torch.equal(a.codes.cpu(), b.codes.cpu()) and torch.equal(
        a.scales.cpu().view(torch.uint8), b.scales.cpu().view(torch.uint8))


@pytest.mark.parametrize("shape,gs", [((5, 64), None), ((3, 7, 32), None), ((4, 48), 0.01),
                                      ((2, 3, 32), "row"), ((3, 32), 0.0)])
def test_bytes_match_reference(dev, shape, gs):
    x = sample(len(shape), shape, dev)
    g = x.abs().amax(-1, keepdim=True) / (6 * 448) if gs == "row" else gs
    t = nvfp4_quantize_triton(x, global_scale=g)
    ref = nvfp4_quantize(x.cpu(), global_scale=g.cpu() if torch.is_tensor(g) else g)
    assert same(t, ref)
    out = torch.full(shape, float("nan"), device=dev)
    assert nvfp4_dequantize_triton(t, out=out) is out
    assert torch.equal(out.cpu(), nvfp4_dequantize(ref))


def test_bf16_input_and_fake_quant(dev):
    x = sample(9, (6, 128), dev, torch.bfloat16)
    ref = nvfp4_dequantize(nvfp4_quantize(x.cpu()))
    assert torch.equal(nvfp4_fake_quant_triton(x).cpu(), ref)


def test_bad_last_dim(dev):
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_quantize_triton(torch.randn(2, 24, device=dev))


@pytest.mark.gpu
@requires_cuda
def test_gpu_expert_weight_shape():
    """A Flash routed-expert w1: [2048, 4096] bf16."""
    x = sample(11, (2048, 4096), "cuda", torch.bfloat16)
    assert same(nvfp4_quantize_triton(x), nvfp4_quantize(x.cpu()))


@pytest.mark.parametrize("T,N,K,per_row", [(5, 70, 128, False), (20, 64, 48, True),
                                           (1, 128, 256, False)])
def test_linear_matches_reference(dev, T, N, K, per_row):
    from dsv4bisect.kernels.nvfp4 import nvfp4_linear, nvfp4_linear_ref

    g = torch.Generator().manual_seed(T + N)
    x, W = torch.randn(T, K, generator=g), torch.randn(N, K, generator=g)
    gs = W.abs().amax(-1, keepdim=True) / (6 * 448) if per_row else None
    w = nvfp4_quantize(W, global_scale=gs)
    ref = nvfp4_linear_ref(x, w)
    full = x @ W.T
    assert 0.05 < float((ref - full).norm() / full.norm()) < 0.15  # NVFP4 weight error
    wd = type(w)(w.codes.to(dev), w.scales.to(dev), w.global_scale.to(dev), w.shape)
    out = nvfp4_linear(x.to(dev), wd).cpu()
    assert float((out - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.gpu
@requires_cuda
def test_gpu_linear_expert_shape():
    from dsv4bisect.kernels.nvfp4 import nvfp4_linear, nvfp4_linear_ref

    x = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
    w = nvfp4_quantize_triton(torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16))
    ref = nvfp4_linear_ref(x, w)
    assert float((nvfp4_linear(x, w) - ref).norm() / ref.norm()) < 1e-5
