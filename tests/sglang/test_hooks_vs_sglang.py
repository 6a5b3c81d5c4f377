"""The hooks against SGLang's own pure-torch versions of the ops they replace (CPU).

Each test builds a synthetic `sglang` from the downloaded wheel (tests/sglang/sglang_tree.py),
keeps SGLang's original function, installs the patch through the real installer and SGLang's
real HookRegistry, and compares: SGLang itself is the reference. The releases are
`wheels.HOOK_VERSIONS` (0.5.13, 0.5.14, 0.5.16 — the kernels/ops move — and the newest), each
with its own module paths (`dsv4bisect.sglang_hooks.targets`).
"""

from __future__ import annotations

import math
import os
import pkgutil

import pytest
import torch
from hookenv import by_patch, install
from sglang_tree import SglangTree, decoder_layer, make_hash_topk, paged_decode_case

from dsv4bisect.sglang_hooks.targets import mla_module, sinkhorn_target


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.fixture
def tree(hook_wheel):
    with SglangTree(hook_wheel) as t:
        yield t


def _mla(tree):
    import importlib

    return importlib.import_module(mla_module(tree.layout))


# ------------------------------------------------------------------------------ mhc-bf16
def _hc_inputs(T: int, D: int = 256, n: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, n, D, generator=g).to(torch.bfloat16)
    fn = torch.randn(24, n * D, generator=g) * (n * D) ** -0.5
    scale = torch.tensor([0.8, 1.1, 0.9])
    base = torch.randn(24, generator=g) * 0.1
    return x, fn, scale, base


def test_mhc_bf16_hook_keeps_the_contract_and_only_rounds_the_gemm(tree):
    import sglang.srt.models.deepseek_v4 as v4

    from dsv4bisect.sglang_hooks.mhc import hc_pre as hook_hc_pre

    cls = v4.DeepseekV4DecoderLayer
    layer = decoder_layer(cls)
    x, fn, scale, base = _hc_inputs(33)
    ref = cls.hc_pre(layer, x, fn, scale, base)  # SGLang's torch path (fp32 GEMM)
    sinkhorn = pkgutil.resolve_name(sinkhorn_target(tree.layout))
    same = hook_hc_pre(layer, x, fn, scale, base, mode="fp32", sinkhorn=sinkhorn)
    for a, b in zip(same[:3], ref[:3]):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert rel(a, b) < 1e-5
    assert same[3] is ref[3] is False
    receipts, _ = install(tree.version, {"mhc-bf16": "bf16"})
    assert by_patch(receipts)["mhc-bf16"].state == "installed"
    got = cls.hc_pre(layer, x, fn, scale, base)  # now the hook, bf16 mixes
    errs = [rel(a, b) for a, b in zip(got[:3], ref[:3])]
    assert all(1e-6 < e < 3e-2 for e in errs), errs  # bf16 rounding, nothing else
    empty = cls.hc_pre(layer, x[:0], fn, scale, base)
    assert [t.shape for t in empty[:3]] == [(0, 256), (0, 4), (0, 4, 4)]


# ----------------------------------------------------------------------- hash-topk-scaling
def _hash_topk(cls, apply: bool, vocab: int = 64, experts: int = 16, rsf: float = 1.5):
    return make_hash_topk(cls, topk=6, num_experts=experts, num_fused_shared_experts=0,
                          vocab_size=vocab, routed_scaling_factor=rsf,
                          apply_routed_scaling_factor_on_output=apply)


def _route(m, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (20,), generator=g)
    logits = torch.randn(20, 16, generator=g)
    return m(torch.zeros(20, 8), logits, ids)


def test_hash_topk_scaling_matches_upstream_0514(hook_wheel):
    from wheels import wheel_of

    with SglangTree(wheel_of("0.5.14")):
        import sglang.srt.layers.moe.hash_topk as h14

        upstream = _route(_hash_topk(h14.HashTopK, True))
        unscaled = _route(_hash_topk(h14.HashTopK, False))
    assert torch.allclose(upstream.topk_weights.sum(-1), torch.full((20,), 1.5))
    with SglangTree(wheel_of("0.5.13")) as t13:
        import sglang.srt.layers.moe.hash_topk as h13

        with pytest.raises(AssertionError, match="not implemented"):
            _hash_topk(h13.HashTopK, True)  # stock 0.5.13
        receipts, _ = install(t13.version, {"hash-topk-scaling": "topk"})
        assert by_patch(receipts)["hash-topk-scaling"].state == "installed"
        ours = _route(_hash_topk(h13.HashTopK, True))
        off = _route(_hash_topk(h13.HashTopK, False))
    assert torch.equal(ours.topk_ids, upstream.topk_ids)
    assert torch.equal(ours.topk_weights, upstream.topk_weights)
    assert torch.equal(off.topk_weights, unscaled.topk_weights)


@pytest.mark.parametrize("apply", [False, True])
def test_double_scale_fault_is_one_rsf_too_many(hook_wheel, apply):
    """`double-scale` multiplies HashTopK's weights by rsf on top of the correct scaling."""
    wheel = hook_wheel

    def weights(variant: str | None) -> torch.Tensor:
        with SglangTree(wheel) as t:
            import sglang.srt.layers.moe.hash_topk as h

            if variant is not None:
                install(t.version, {"hash-topk-scaling": variant})
            return _route(_hash_topk(h.HashTopK, apply)).topk_weights

    good = weights("topk" if SglangTree(wheel).version == "0.5.13" else None)
    assert torch.allclose(weights("double-scale"), good * 1.5, rtol=1e-6)


# -------------------------------------------------------------------------------- mma-decode
@pytest.mark.parametrize("variant,lo,hi", [("split-k-fp32", 0.0, 2e-5),
                                           ("split-k", 1e-5, 2e-2),
                                           ("merge-no-rescale", 5e-2, 10.0)])
def test_mma_decode_against_sglang_torch_decode(tree, variant, lo, hi):
    mla = _mla(tree)
    kw = paged_decode_case(B=3, H=8, n_swa=128, n_extra=200)
    ref_out, ref_lse = mla.flash_mla_with_kvcache_sm120(**kw)  # SGLang's torch fallback
    assert mla._sm120_default_backend == "torch"
    receipts, _ = install(tree.version, {"mma-decode": variant})
    assert by_patch(receipts)["mma-decode"].state == "installed"
    out, lse = mla.flash_mla_with_kvcache_sm120(**kw)
    assert out.shape == ref_out.shape and out.dtype == torch.bfloat16 and lse is None
    assert lo <= rel(out, ref_out) < hi, rel(out, ref_out)


def test_mma_decode_kernel_interpreted_matches_sglang(tree, monkeypatch):
    """The Triton kernel itself (TRITON_INTERPRET=1), small shape, through the hook."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        assert os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest before any kernel
    monkeypatch.setenv("DSV4BISECT_PLUGIN_KERNELS", "triton")
    mla = _mla(tree)
    kw = paged_decode_case(B=1, H=16, n_swa=70, n_extra=20, seed=3)
    ref_out, _ = mla.flash_mla_with_kvcache_sm120(**kw)
    install(tree.version, {"mma-decode": "split-k-fp32"})
    out, _ = mla.flash_mla_with_kvcache_sm120(**kw)
    assert rel(out, ref_out) < 1e-2  # interpreted operands are bf16-rounded like the GPU's


# ---------------------------------------------------------------------------- triton-indexer
def _indexer_case(B: int, H: int, max_seq: int, seed: int = 0):
    from dsv4bisect.kernels.indexer import pack_indexer_pages

    g = torch.Generator().manual_seed(seed)
    n_pages = math.ceil(max_seq / 64)
    pages = pack_indexer_pages(torch.randn(n_pages * 64 * B, 128, generator=g))
    perm = torch.randperm(pages.shape[0], generator=g)[: B * n_pages].view(B, n_pages)
    q = (torch.randn(B, 1, H, 128, generator=g) * 4).to(torch.float8_e4m3fn)
    w = torch.randn(B, H, generator=g) * 128 ** -0.5 * H ** -0.5
    lens = torch.randint(1, max_seq + 1, (B, 1), generator=g, dtype=torch.int32)
    return q, pages, w, lens, perm.to(torch.int32), max_seq


@pytest.mark.parametrize("variant", ["fp32", "bf16"])
def test_triton_indexer_against_sglang_torch_logits(tree, variant):
    """SGLang's torch indexer upcasts to fp32 up to 0.5.15 and to bf16 (a bf16 bmm) from 0.5.16:
    the variant with the release's own rounding matches it to fp32 noise, the other differs by
    bf16 rounding."""
    import sglang.srt.layers.attention.dsv4.indexer as ix

    stock = "bf16" if tree.layout >= "0.5.16" else "fp32"
    q, pages, w, lens, pt, max_seq = _indexer_case(B=4, H=16, max_seq=300)
    ref = ix.fp8_paged_mqa_logits_torch_sm120(q, pages, w, lens, pt, None, max_seq, False)
    install(tree.version, {"triton-indexer": variant})
    got = ix.fp8_paged_mqa_logits_torch_sm120(q, pages, w, lens, pt, None, max_seq, False)
    assert got.shape == ref.shape == (4, max_seq) and got.dtype == torch.float32
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    fin = torch.isfinite(ref)
    lo, hi = (0.0, 1e-6) if variant == stock else (1e-5, 1e-2)
    assert lo <= rel(got[fin], ref[fin]) < hi


def test_triton_indexer_kernel_interpreted_matches_sglang(tree, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("DSV4BISECT_PLUGIN_KERNELS", "triton")
    import sglang.srt.layers.attention.dsv4.indexer as ix

    q, pages, w, lens, pt, max_seq = _indexer_case(B=2, H=16, max_seq=130, seed=5)
    ref = ix.fp8_paged_mqa_logits_torch_sm120(q, pages, w, lens, pt, None, max_seq, False)
    stock = "bf16" if tree.layout >= "0.5.16" else "fp32"
    install(tree.version, {"triton-indexer": stock})
    got = ix.fp8_paged_mqa_logits_torch_sm120(q, pages, w, lens, pt, None, max_seq, False)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(got)) and rel(got[fin], ref[fin]) < 1e-5
