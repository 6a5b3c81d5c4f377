"""indexer_logits_ref and indexer_topk against straightforward loops and a Python sort."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.kernels.indexer import indexer_logits_ref, indexer_topk


def make_inputs(seed: int, T: int, H: int, d: int, S: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, d, generator=g)
    w = torch.randn(T, H, generator=g) * (d * H) ** -0.5
    k = torch.randn(S, d, generator=g)
    n_vis = torch.randint(0, S + 1, (T,), generator=g)
    return q, w, k, n_vis


def loop_logits(q, w, k, n_vis, mode) -> torch.Tensor:
    """One (t, h) at a time; dots in float64 (fp32 mode) or fp32 rounded to bf16 (bf16 mode)."""
    T, H, _ = q.shape
    S = k.shape[0]
    out = torch.full((T, S), float("-inf"), dtype=torch.float64)
    for t in range(T):
        n = int(n_vis[t])
        acc = torch.zeros(n, dtype=torch.float64)
        for h in range(H):
            if mode == "fp32":
                dots = k[:n].double() @ q[t, h].double()
            else:
                dots = (k[:n] * q[t, h]).sum(-1).to(torch.bfloat16).double()
            acc += w[t, h].double() * dots.clamp_min(0)
        out[t, :n] = acc
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), T=st.integers(1, 12), H=st.integers(1, 6),
       d=st.sampled_from([8, 32]), S=st.integers(1, 90))
def test_fp32_matches_loop(seed, T, H, d, S):
    q, w, k, n_vis = make_inputs(seed, T, H, d, S)
    out = indexer_logits_ref(q, w, k, n_vis)
    ref = loop_logits(q, w, k, n_vis, "fp32")
    assert out.dtype == torch.float32 and out.shape == (T, S)
    cols = torch.arange(S)[None, :]
    assert torch.isneginf(out[cols >= n_vis[:, None]]).all()
    vis = cols < n_vis[:, None]
    assert torch.allclose(out[vis].double(), ref[vis], rtol=1e-5, atol=1e-6)


def test_bf16_matches_loop_and_sits_in_bf16_range():
    q, w, k, n_vis = make_inputs(3, 16, 8, 64, 300)
    n_vis[:] = 300
    b = indexer_logits_ref(q, w, k, n_vis, mode="bf16")
    f = indexer_logits_ref(q, w, k, n_vis, mode="fp32")
    ref = loop_logits(q, w, k, n_vis, "bf16")
    # summation order inside the dot can move a value across a bf16 rounding edge: rare
    close = torch.isclose(b.double(), ref, rtol=1e-5, atol=1e-6)
    assert close.float().mean() > 0.98
    err = float((b - f).norm() / f.norm())
    assert 1e-4 < err < 1e-2, err


def test_mode_and_visibility_edges():
    q, w, k, n_vis = make_inputs(4, 5, 2, 8, 10)
    n_vis = torch.tensor([0, 1, 10, 25, -3])  # 25 clamps to S, negative to 0
    out = indexer_logits_ref(q, w, k, n_vis)
    assert torch.isneginf(out[0]).all() and torch.isneginf(out[4]).all()
    assert torch.isfinite(out[1, :1]).all() and torch.isneginf(out[1, 1:]).all()
    assert torch.isfinite(out[2]).all() and torch.isfinite(out[3]).all()
    with pytest.raises(ValueError):
        indexer_logits_ref(q, w, k, n_vis, mode="fp16")
    with pytest.raises(ValueError):
        indexer_logits_ref(q, w[:, :1], k, n_vis)


def sorted_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    out = torch.full((scores.shape[0], k), -1, dtype=torch.int64)
    for t, row in enumerate(scores.tolist()):
        order = sorted((-v, i) for i, v in enumerate(row) if v != float("-inf"))
        for j, (_, i) in enumerate(order[:k]):
            out[t, j] = i
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), S=st.integers(1, 40), k=st.integers(0, 50),
       levels=st.sampled_from([3, 1000]))
def test_topk_matches_python_sort_with_ties(seed, S, k, levels):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(-levels, levels, (6, S), generator=g).float() / 7
    scores[torch.rand(6, S, generator=g) < 0.3] = float("-inf")
    scores[scores == 0] = -0.0  # signed zeros must tie with +0.0
    scores[0, : S // 2] = 0.0
    assert torch.equal(indexer_topk(scores, k), sorted_topk(scores, k))


def test_topk_on_logits_and_all_masked_row():
    q, w, k, n_vis = make_inputs(9, 7, 4, 16, 64)
    n_vis[0] = 0
    scores = indexer_logits_ref(q, w, k, n_vis, mode="bf16")
    top = indexer_topk(scores, 12)
    assert top.dtype == torch.int64 and top.shape == (7, 12)
    assert (top[0] == -1).all()
    assert torch.equal(top, sorted_topk(scores, 12))
    for t in range(7):  # never selects an invisible entry
        sel = top[t][top[t] >= 0]
        assert (sel < n_vis[t]).all() and sel.unique().numel() == sel.numel()
