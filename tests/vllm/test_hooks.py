"""The vLLM hook bodies on this CPU: FlashMLA's call form on the split-K kernel (its `out=`
buffer filled, a dense call passed through), the mHC pre block's contract and its trace by
Dynamo with `fullgraph` (vLLM compiles the model so), the TRT-LLM clamp fault, the double-scale
factor. Against vLLM's own torch code: tests/vllm/gpu_vllm_check.py (CPU arm in test_wheels)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from dsv4bisect.sglang_hooks.attention import sparse_decode  # noqa: E402
from dsv4bisect.vllm_hooks import attention, mhc, quant, routing  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "sglang"))
from sglang_tree import paged_decode_case  # noqa: E402

ARGS = (1e-6, 1e-6, 1e-6, 2.0, 20)


def test_flashmla_call_form_fills_the_output_buffer() -> None:
    kw = paged_decode_case(B=2, H=8, n_swa=96, n_extra=40)
    B, _, H, _ = kw["q"].shape
    out = torch.full((B, 1, H, 512), float("nan"), dtype=torch.bfloat16)
    vllm_kw = dict(kw, block_table=None, cache_seqlens=None, tile_scheduler_metadata=None,
                   is_fp8_kvcache=True, out=out)
    got, lse = attention.decode(None, "split-k", **vllm_kw)
    assert got is out and lse is None
    want, _ = sparse_decode(kw, torch.bfloat16, "lse")
    assert torch.equal(out, want)
    calls = []
    dense = attention.decode(lambda **k: calls.append(k) or ("dense", None), "split-k",
                                   **dict(vllm_kw, indices=None))
    assert dense == ("dense", None) and calls  # not the sparse FP8 path: FlashMLA's own


def _mhc_inputs(t: int = 5, n: int = 4, d: int = 32) -> dict:
    g = torch.Generator().manual_seed(3)
    m = (2 + n) * n
    return dict(residual=torch.randn(t, n, d, generator=g).bfloat16(),
                fn=torch.randn(m, n * d, generator=g) * 0.1, hc_scale=torch.rand(3, generator=g),
                hc_base=torch.randn(m, generator=g) * 0.1)


def test_mhc_pre_keeps_vllms_contract_and_the_patch_moves_it() -> None:
    i = _mhc_inputs()
    post, comb, y = mhc.mhc_pre(*i.values(), *ARGS, mode="fp32")
    assert post.shape == (5, 4, 1) and comb.shape == (5, 4, 4) and y.shape == (5, 32)
    assert y.dtype == torch.bfloat16 and post.dtype == comb.dtype == torch.float32
    assert torch.allclose(comb.sum(-2), torch.ones(5, 4), atol=1e-3)  # Sinkhorn: doubly stochastic
    post16, comb16, y16 = mhc.mhc_pre(*i.values(), *ARGS, mode="bf16")
    assert 0 < float((comb16 - comb).abs().max()) < 0.05  # the bf16 mixes: small, not zero
    streams, *rest = mhc.pre_broadcast(i["residual"][:, 0].contiguous(), *list(
        i.values())[1:], *ARGS, mode="fp32")
    assert streams.shape == (5, 4, 32) and torch.equal(streams[:, 1], streams[:, 3])


def test_the_mhc_hook_is_traced_by_dynamo_with_fullgraph() -> None:
    i = _mhc_inputs()
    eager = mhc.mhc_pre(*i.values(), *ARGS, mode="bf16")
    compiled = torch.compile(lambda r: mhc.mhc_pre(r, *list(i.values())[1:], *ARGS,
                                                         mode="bf16"),
                             fullgraph=True, backend="eager")
    got = compiled(i["residual"])
    assert all(torch.equal(a, b) for a, b in zip(got, eager))


def test_ignore_alpha_puts_the_unfolded_limit_back() -> None:
    experts = SimpleNamespace(gemm1_clamp_limit=torch.full((4,), 10.0))
    alphas = torch.tensor([2.0, 4.0, 5.0, 10.0])

    def fold(self: SimpleNamespace, layer: object) -> None:  # what vLLM >= 0.22 does
        self.gemm1_clamp_limit = torch.nn.Parameter(self.gemm1_clamp_limit / alphas,
                                                    requires_grad=False)

    assert quant.restore_unfolded(fold, experts, None) == 10.0
    assert torch.equal(experts.gemm1_clamp_limit.data, torch.full((4,), 10.0))
    plan = quant.clamp_plan("alpha", "0.34.0", None)
    assert plan.action == "inert" and "folds" in (plan.reason or "")
    assert quant.clamp_plan("ignore-alpha", "0.20.0", None).action == "refuse"


def test_double_scale_only_on_hash_layers() -> None:
    routing.RSF["model"] = 1.5
    args = (None,) * 8
    assert routing.extra_factor(args + (torch.zeros(3, 6),), {}) == 1.5
    assert routing.extra_factor(args + (None,), {}) == 1.0
    assert routing.plan("topk", "0.34.0", None).action == "inert"
