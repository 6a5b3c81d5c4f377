"""Triton indexer logits against `indexer_logits_ref` (interpreter on CPU, native on CUDA),
with NaN-poisoned outputs; on the GPU also the top-k overlap of bf16 vs fp32 scores."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.kernels.indexer import indexer_logits, indexer_logits_ref, indexer_topk

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def inputs(seed, T, H, d, S, dev, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, d, generator=g).to(dtype)
    w = torch.randn(T, H, generator=g) * (H * d) ** -0.5
    k = torch.randn(S, d, generator=g).to(dtype)
    n_vis = torch.randint(0, S + 8, (T,), generator=g)
    return [x.to(dev) for x in (q, w, k, n_vis)]


def run(q, w, k, n_vis, mode):
    out = torch.full((q.shape[0], k.shape[0]), float("nan"), device=q.device)
    assert indexer_logits(q, w, k, n_vis, mode=mode, out=out) is out
    assert not torch.isnan(out).any()
    return out.cpu()


def check(out, ref, tol):
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    err = float((out[fin] - ref[fin]).norm() / ref[fin].norm().clamp_min(1e-30))
    assert err < tol, err


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 37])
def test_matches_reference(dev, mode, T):
    q, w, k, n_vis = inputs(1, T, 3, 24, 150, dev)
    n_vis[0] = 0
    ref = indexer_logits_ref(q.cpu(), w.cpu(), k.cpu(), n_vis.cpu(), mode=mode)
    # bf16: a dot within an fp32 ulp of a bf16 rounding edge may round the other way
    check(run(q, w, k, n_vis, mode), ref, 1e-5 if mode == "fp32" else 1e-3)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), T=st.integers(1, 40), H=st.integers(1, 8),
       d=st.sampled_from([16, 32, 48, 128]), S=st.integers(1, 140),
       mode=st.sampled_from(["fp32", "bf16"]))
def test_random_shapes(seed, T, H, d, S, mode):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, w, k, n_vis = inputs(seed, T, H, d, S, dev)
    ref = indexer_logits_ref(q.cpu(), w.cpu(), k.cpu(), n_vis.cpu(), mode=mode)
    check(run(q, w, k, n_vis, mode), ref, 1e-5 if mode == "fp32" else 1e-3)


def test_head_dim_limit(dev):
    q, w, k, n_vis = inputs(2, 2, 2, 300, 8, dev)
    with pytest.raises(ValueError, match="head dims"):
        indexer_logits(q, w, k, n_vis)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("S", [2048, 32768])
def test_gpu_flash_shapes_and_topk_overlap(S):
    """Flash indexer: 64 heads × 128 dims, top-512. bf16 scores keep most selections."""
    q, w, k, _ = inputs(3, 16, 64, 128, S, "cuda")
    n_vis = torch.full((16,), S, device="cuda")
    ref = indexer_logits_ref(q.cpu(), w.cpu(), k.cpu(), n_vis.cpu())
    check(run(q, w, k, n_vis, "fp32"), ref, 1e-5)
    b = run(q, w, k, n_vis, "bf16")
    top_f, top_b = indexer_topk(ref, 512), indexer_topk(b, 512)
    overlap = sum(len(set(f.tolist()) & set(g.tolist())) for f, g in zip(top_f, top_b))
    assert 0.9 < overlap / top_f.numel() <= 1.0


def paged_inputs(seed, B, H, S, dev, shuffle=True):
    g = torch.Generator().manual_seed(seed)
    from dsv4bisect.kernels.indexer import pack_indexer_pages

    pages = pack_indexer_pages(torch.randn(S, 128, generator=g))
    perm = torch.randperm(pages.shape[0], generator=g) if shuffle else torch.arange(pages.shape[0])
    where = torch.empty_like(perm)
    where[perm] = torch.arange(perm.numel())
    q = (torch.randn(B, H, 128, generator=g) * 3).to(torch.float8_e4m3fn)
    w = torch.randn(B, H, generator=g) * 0.01
    lens = torch.randint(0, S + 1, (B,), generator=g)
    lens[0] = 0
    pt = where[None, :].repeat(B, 1).int()
    return [x.to(dev) for x in (q, pages[perm], w, lens, pt)]


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_paged_fp8_matches_reference(dev, mode):
    from dsv4bisect.kernels.indexer import indexer_logits_paged, indexer_logits_paged_ref

    q, pages, w, lens, pt = paged_inputs(1, 5, 8, 300, dev)
    out = torch.full((5, 330), float("nan"), device=dev)
    assert indexer_logits_paged(q, pages, w, lens, pt, 330, mode=mode, out=out) is out
    assert not torch.isnan(out).any()
    ref = indexer_logits_paged_ref(*(x.cpu() for x in (q, pages, w, lens, pt)), 330, mode=mode)
    check(out.cpu(), ref, 1e-5 if mode == "fp32" else 1e-3)


def test_paged_reference_is_the_formula():
    """score[b, s] = scale[s] · Σ_h w[b, h] · relu(q[b, h] · k[s]) with k the FP8 values."""
    from dsv4bisect.kernels.indexer import indexer_logits_paged_ref

    q, pages, w, lens, pt = paged_inputs(2, 4, 6, 200, "cpu", shuffle=False)
    flat = pages.view(pages.shape[0], -1)
    k = flat[:, : 64 * 128].contiguous().view(torch.float8_e4m3fn).float().view(-1, 128)
    scale = flat[:, 64 * 128 :].contiguous().view(torch.float32).reshape(-1)
    plain = indexer_logits_ref(q.float(), w, k, lens)
    want = torch.where(torch.isfinite(plain), plain * scale[None, :], plain)
    got = indexer_logits_paged_ref(q, pages, w, lens, pt, k.shape[0])
    check(got, want, 1e-6)


@pytest.mark.gpu
@requires_cuda
def test_gpu_paged_flash_shapes():
    """64 heads × 128 dims, 32k C4 entries (128k context), FP8 tensor-core dots."""
    from dsv4bisect.kernels.indexer import indexer_logits_paged, indexer_logits_paged_ref

    q, pages, w, lens, pt = paged_inputs(3, 16, 64, 32768, "cuda")
    for mode, tol in (("fp32", 1e-5), ("bf16", 1e-3)):
        ref = indexer_logits_paged_ref(q, pages, w, lens, pt, 32768, mode=mode).cpu()
        check(indexer_logits_paged(q, pages, w, lens, pt, 32768, mode=mode).cpu(), ref, tol)
