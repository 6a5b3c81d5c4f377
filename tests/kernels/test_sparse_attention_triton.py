"""Triton split-K attention against `sparse_attention_ref`: relative error with fresh random
inputs, outputs and scratch poisoned with NaN so that every element must be written. Runs
under TRITON_INTERPRET=1 on CPU (small shapes) or natively on CUDA."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.kernels import sparse_attention as sa

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
MODES = [
    dict(),
    dict(split=64),
    dict(split=64, partial_dtype=torch.bfloat16),
    dict(split=64, merge="no-rescale"),
    dict(split=64, partial_dtype=torch.bfloat16, merge="no-rescale"),
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def inputs(seed, T, H, D, N, K, dev, p_invalid=0.0, kv_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D, generator=g)
    kv = torch.randn(N, D, generator=g).to(kv_dtype)
    idx = torch.stack([torch.randperm(N, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    if p_invalid:
        idx[torch.rand(T, K, generator=g) < p_invalid] = -1
    sink = torch.randn(H, generator=g)
    return [x.to(dev) for x in (q, kv, idx, sink)]


@pytest.fixture
def poisoned_scratch(monkeypatch):
    def alloc(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(sa, "_alloc", alloc)


def run(q, kv, idx, sink, scale, **kw) -> torch.Tensor:
    out = torch.full(q.shape, float("nan"), device=q.device)
    res = sa.sparse_attention(q, kv, idx, sink, scale, out=out, **kw)
    assert res is out and not torch.isnan(out).any()
    return out


@pytest.mark.parametrize("kw", MODES, ids=["exact", "fp32", "bf16", "nr-fp32", "nr-bf16"])
def test_matches_reference_with_holes_and_empty_lists(dev, poisoned_scratch, kw):
    q, kv, idx, sink = inputs(1, 6, 3, 40, 300, 150, dev, p_invalid=0.2)
    idx[0] = -1  # no key at all
    idx[1, :70] = -1  # an empty first split
    out = run(q, kv, idx, sink, 0.15, **kw)
    ref = sa.sparse_attention_ref(q.cpu(), kv.cpu(), idx.cpu(), sink.cpu(), 0.15, **kw)
    assert torch.equal(out[0].cpu(), torch.zeros_like(ref[0]))
    tol = 1e-5 if kw.get("partial_dtype", torch.float32) == torch.float32 else 2e-3
    assert rel(out.cpu(), ref) < tol


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), T=st.integers(1, 4), H=st.integers(1, 20),
       D=st.sampled_from([16, 24, 64, 80]), K=st.integers(1, 200),
       mode=st.sampled_from(range(len(MODES))))
def test_random_shapes(seed, T, H, D, K, mode):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, kv, idx, sink = inputs(seed, T, H, D, 256, min(K, 256), dev, p_invalid=0.1)
    kw = MODES[mode]
    out = run(q, kv, idx, sink, 1 / math.sqrt(D), **kw)
    ref = sa.sparse_attention_ref(q.cpu(), kv.cpu(), idx.cpu(), sink.cpu(), 1 / math.sqrt(D), **kw)
    tol = 1e-5 if kw.get("partial_dtype", torch.float32) == torch.float32 else 2e-3
    assert rel(out.cpu(), ref) < tol


def test_one_split_no_rescale_equals_lse_bitwise(dev):
    q, kv, idx, sink = inputs(2, 4, 4, 32, 200, 120, dev)
    idx[:, 40:] = -1
    a = run(q, kv, idx, sink, 0.2, split=64, partial_dtype=torch.bfloat16)
    b = run(q, kv, idx, sink, 0.2, split=64, partial_dtype=torch.bfloat16, merge="no-rescale")
    assert torch.equal(a, b)


def test_bf16_kv_rounds_operands_like_tensor_cores(dev):
    """bf16 kv: q and the softmax weights are bf16 dot operands (fp32 accumulation)."""
    q, kv, idx, sink = inputs(3, 5, 8, 64, 256, 200, dev, kv_dtype=torch.bfloat16)
    out = run(q, kv, idx, sink, 0.125, split=64, partial_dtype=torch.bfloat16)
    ref = sa.sparse_attention_ref(q.cpu(), kv.cpu(), idx.cpu(), sink.cpu(), 0.125)
    assert 1e-3 < rel(out.cpu(), ref) < 1e-2


def test_argument_errors(dev):
    q, kv, idx, sink = inputs(4, 2, 2, 16, 32, 8, dev)
    with pytest.raises(ValueError, match="split"):
        sa.sparse_attention(q, kv, idx, sink, 0.3, split=48)
    with pytest.raises(ValueError, match="partials"):
        sa.sparse_attention(q, kv, idx, sink, 0.3, split=64, partial_dtype=torch.float16)
    with pytest.raises(ValueError, match="out"):
        sa.sparse_attention(q, kv, idx, sink, 0.3, out=torch.empty(2, 2, 15, device=dev))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("K", [128 + 512, 4096, 32768])
def test_gpu_flash_shapes(K):
    """DeepSeek-V4-Flash decode: 64 heads, one 512-dim K=V head, bf16 KV; the bf16-partial
    error stays at the bf16 level at every context length and the fp32 path is exact."""
    q, kv, idx, sink = inputs(5, 8, 64, 512, max(K, 1024), K, "cuda", kv_dtype=torch.bfloat16)
    ref = sa.sparse_attention_ref(q, kv, idx, sink, 512**-0.5).cpu()  # fp32 torch on the GPU
    for kw, lo, hi in ((dict(split=64, partial_dtype=torch.bfloat16), 1e-3, 1e-2),
                       (dict(split=64, merge="no-rescale"), 1e-2, 1.0)):
        assert lo < rel(run(q, kv, idx, sink, 512**-0.5, **kw).cpu(), ref) < hi
    q, kvf = q.float(), kv.float()
    assert rel(run(q, kvf, idx, sink, 512**-0.5).cpu(), ref) < 1e-5


def fp8_inputs(seed, T, H, dev):
    g = torch.Generator().manual_seed(seed)
    kv1, kv2 = torch.randn(300, 512, generator=g), torch.randn(60, 512, generator=g)
    c1, c2 = sa.model1_pack(kv1, 256), sa.model1_pack(kv2, 64)
    i1 = torch.stack([torch.randperm(300, generator=g)[:100] for _ in range(T)]).int()
    i2 = torch.stack([torch.randperm(60, generator=g)[:40] for _ in range(T)]).int()
    i1[0, 30:] = -1
    i2[1] = -1
    q = torch.randn(T, H, 512, generator=g).bfloat16().float()
    srcs = [sa.PagedKV(c1.to(dev), i1.to(dev), 256), sa.PagedKV(c2.to(dev), i2.to(dev), 64)]
    dense = torch.cat([sa.model1_unpack(c1, 256, torch.arange(300)),
                       sa.model1_unpack(c2, 64, torch.arange(60))]).bfloat16()
    lists = torch.cat([i1, torch.full((T, 28), -1, dtype=torch.int32),
                       torch.where(i2 >= 0, i2 + 300, -1).int()], dim=1)
    return q.to(dev), srcs, torch.randn(H, generator=g).to(dev), dense.to(dev), lists.to(dev)


@pytest.mark.parametrize("kw", MODES[:3], ids=["exact", "split-fp32", "split-bf16"])
def test_fp8_pages_read_like_dense_bf16_rows(dev, poisoned_scratch, kw):
    """The MODEL1 page decoder gives the same numbers as the dense kernel on the dequantized
    rows (same tensor-core numerics; bf16 partials to their rounding), and stays at the bf16 level against the fp32 reference."""
    q, srcs, sink, dense, lists = fp8_inputs(1, 3, 4, dev)
    out = torch.full(q.shape, float("nan"), device=dev)
    got = sa.sparse_attention_fp8(q, srcs, sink, 0.05, out=out, **kw)
    assert got is out and not torch.isnan(out).any()
    same = run(q, dense, lists, sink, 0.05, **kw)
    # The page decoder splits per source, the dense kernel over the padded concatenated list:
    # the split boundaries differ, so bf16 partials round differently (H200: 6.3e-5).
    same_tol = 1e-6 if kw.get("partial_dtype") is None else 1e-3
    assert rel(out.cpu(), same.cpu()) < same_tol
    ref = sa.sparse_attention_fp8_ref(q.cpu(), [sa.PagedKV(s.cache.cpu(), s.indices.cpu(),
                                                           s.page_size) for s in srcs],
                                      sink.cpu(), 0.05, **kw)
    assert rel(out.cpu(), ref) < 1e-2


def test_baselines_match_reference(dev, poisoned_scratch):
    q, kv, idx, sink = inputs(6, 5, 3, 40, 300, 150, dev, p_invalid=0.2)
    idx[0] = -1
    out = torch.full(q.shape, float("nan"), device=dev)
    sa.sparse_attention_baseline(q, kv, idx, sink, 0.15, out=out)
    ref = sa.sparse_attention_ref(q.cpu(), kv.cpu(), idx.cpu(), sink.cpu(), 0.15)
    assert not torch.isnan(out).any() and rel(out.cpu(), ref) < 5e-3  # bf16 output
    qf, srcs, sinkf, _, _ = fp8_inputs(2, 2, 3, dev)
    ref = sa.sparse_attention_fp8_ref(qf.cpu(), [sa.PagedKV(s.cache.cpu(), s.indices.cpu(),
                                                            s.page_size) for s in srcs],
                                      sinkf.cpu(), 0.05)
    assert rel(sa.sparse_attention_fp8_baseline(qf, srcs, sinkf, 0.05).cpu(), ref) < 5e-3


@pytest.mark.parametrize("split", [32, 128, 192])
def test_splits_of_several_tiles(dev, poisoned_scratch, split):
    q, kv, idx, sink = inputs(7, 3, 2, 32, 500, 400, dev, p_invalid=0.1)
    for pdt in (torch.float32, torch.bfloat16):
        out = run(q, kv, idx, sink, 0.2, split=split, partial_dtype=pdt)
        ref = sa.sparse_attention_ref(q.cpu(), kv.cpu(), idx.cpu(), sink.cpu(), 0.2, split=split,
                                      partial_dtype=pdt)
        assert rel(out.cpu(), ref) < (1e-5 if pdt == torch.float32 else 2e-3)


def test_exact_path_launch_configs(dev):
    q, kv, idx, sink = inputs(8, 2, 5, 64, 700, 600, dev)
    ref = sa.sparse_attention_ref(q.cpu(), kv.cpu(), idx.cpu(), sink.cpu(), 0.125)
    for cfg in (sa.AttnConfig(tiles=1), sa.AttnConfig(tiles=4, block_h=16, num_stages=1)):
        assert rel(run(q, kv, idx, sink, 0.125, config=cfg).cpu(), ref) < 1e-5


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("B", [1, 64])
def test_gpu_fp8_sparse_flash_shapes(B):
    """SGLang layout at Flash shapes: 512 C4 keys (pages of 64) + 128 SWA keys (pages of 256)."""
    g = torch.Generator().manual_seed(B)
    c4 = sa.model1_pack(torch.randn(2048, 512, generator=g), 64).cuda()
    swa = sa.model1_pack(torch.randn(512, 512, generator=g), 256).cuda()
    sel = torch.stack([torch.randperm(2048, generator=g)[:512] for _ in range(B)]).int()
    win = (torch.arange(128) + 100).repeat(B, 1).int()
    srcs = [sa.PagedKV(c4, sel.cuda(), 64), sa.PagedKV(swa, win.cuda(), 256)]
    q = torch.randn(B, 64, 512, generator=g).cuda()
    sink = torch.randn(64, generator=g).cuda()
    ref = sa.sparse_attention_fp8_ref(q, srcs, sink, 512**-0.5).cpu()
    for kw in ({}, dict(split=64, partial_dtype=torch.bfloat16)):
        out = sa.sparse_attention_fp8(q, srcs, sink, 512**-0.5, **kw).cpu()
        assert 1e-4 < rel(out, ref) < 1e-2
    base = sa.sparse_attention_fp8_baseline(q, srcs, sink, 512**-0.5).cpu()
    assert rel(base, ref) < 1e-2
