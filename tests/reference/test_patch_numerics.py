"""Every patch moves the embedded model's numerics as its risk says, and no more."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4bisect.errors import ConfigError, PatchError
from dsv4bisect.kernels.mhc_mixes import mhc_mixes_ref
from dsv4bisect.kernels.sparse_attention import sparse_attention_ref
from dsv4bisect.reference import model as model_module
from dsv4bisect.reference.config import ModelArgs, Numerics
from dsv4bisect.reference.model import swiglu

TINY = ModelArgs.preset("tiny")
RSF = TINY.routed_scaling_factor


def ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def logits(
    model, patches: dict[str, str], tokens: torch.Tensor, backend: str = "triton"
) -> torch.Tensor:
    model.configure(Numerics.from_patches(patches, backend))
    with torch.inference_mode():
        return model(tokens)


def rel(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x - y).norm() / y.norm())


def moe_outputs(
    model, patches: dict[str, str], backend: str = "triton", **kw
) -> list[torch.Tensor]:
    """Each layer's MoE output for the same inputs (x, tokens) under a patch set."""
    model.configure(Numerics.from_patches(patches, backend, **kw))
    x = torch.randn(64, TINY.hidden_size, generator=torch.Generator().manual_seed(7))
    step = model._step(ids(64, seed=7), 0)
    return [blk.ffn(x, step) for blk in model.layers]


def test_patch_sets_are_validated() -> None:
    with pytest.raises(PatchError, match="unknown patch"):
        Numerics.from_patches({"fast-math": "on"})
    with pytest.raises(PatchError, match="no variant"):
        Numerics.from_patches({"hash-topk-scaling": "triple"})
    with pytest.raises(ConfigError, match="backend"):
        Numerics.from_patches({}, "vllm")
    n = Numerics.from_patches({"trtllm-clamp": "", "mhc-bf16": "bf16"})
    assert list(n.patches.items()) == [("mhc-bf16", "bf16"), ("trtllm-clamp", "alpha")]


# ---- hash-topk-scaling --------------------------------------------------------------------------


def test_hash_topk_scaling_moves_rsf_but_applies_it_once(model) -> None:
    off = moe_outputs(model, {})
    topk = moe_outputs(model, {"hash-topk-scaling": "topk"})
    for layer in range(TINY.num_hidden_layers):
        if layer < TINY.num_hash_layers:
            torch.testing.assert_close(topk[layer], off[layer], rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(topk[layer], off[layer])
    tokens = ids(200)
    assert (
        rel(logits(model, {"hash-topk-scaling": "topk"}, tokens), logits(model, {}, tokens)) < 1e-5
    )


def test_double_scale_multiplies_the_routed_output_of_hash_layers_by_rsf(model) -> None:
    off = moe_outputs(model, {})
    double = moe_outputs(model, {"hash-topk-scaling": "double-scale"})
    x = torch.randn(64, TINY.hidden_size, generator=torch.Generator().manual_seed(7))
    for layer, blk in enumerate(model.layers):
        sh = blk.ffn.shared_experts
        shared = swiglu(x @ sh.w1.weight.T, x @ sh.w3.weight.T, TINY.swiglu_limit) @ sh.w2.weight.T
        if layer < TINY.num_hash_layers:
            torch.testing.assert_close(
                double[layer] - shared, RSF * (off[layer] - shared), rtol=1e-4, atol=1e-5
            )
        else:
            assert torch.equal(double[layer], off[layer])


# ---- nvfp4-dispatch and trtllm-clamp ------------------------------------------------------------


def test_nvfp4_weight_error_is_what_the_format_predicts(model) -> None:
    model.configure(Numerics.from_patches({"nvfp4-dispatch": "hybrid"}))
    errors = []
    for blk in model.layers:
        for e, q in blk.ffn._quant.items():
            ex = blk.ffn.experts[str(e)]
            errors += [rel(q.w1, ex.w1.weight), rel(q.w2, ex.w2.weight), rel(q.w3, ex.w3.weight)]
    assert len(errors) == 3 * TINY.n_routed_experts * TINY.num_hidden_layers
    # E2M1 (1 mantissa bit) with a per-16 E4M3 scale: ~9-10 % RMS on Gaussian weights
    assert 0.05 < min(errors) and max(errors) < 0.12
    assert all(not blk.ffn._quant for blk in model.mtp)  # MTP experts stay as stored


def test_nvfp4_dispatch_map_restricts_the_layers(model) -> None:
    off = moe_outputs(model, {})
    only3 = moe_outputs(model, {"nvfp4-dispatch": "hybrid"}, nvfp4_layers=frozenset({3}))
    for layer in range(TINY.num_hidden_layers):
        assert torch.equal(only3[layer], off[layer]) == (layer != 3)
    weights_only = moe_outputs(model, {"nvfp4-dispatch": "weights-only"}, "marlin")
    hybrid = moe_outputs(model, {"nvfp4-dispatch": "hybrid"}, "marlin")
    for layer in range(TINY.num_hidden_layers):  # W4A4 adds the activation error to W4A16's
        e_w, e_wa = rel(weights_only[layer], off[layer]), rel(hybrid[layer], off[layer])
        assert 0.01 < e_w < e_wa < 0.3


def test_clamp_rules_per_backend_and_variant(model) -> None:
    def rule(patches: dict[str, str], backend: str, layer: int = 3, **kw) -> str:
        model.configure(Numerics.from_patches(patches, backend, **kw))
        return model.layers[layer].ffn.routed_clamp()

    assert rule({}, "triton") == "limit"  # not NVFP4: always clamped
    assert rule({"nvfp4-dispatch": "hybrid"}, "triton") == "none"  # cutlass_moe_fp4
    assert rule({"nvfp4-dispatch": "hybrid"}, "marlin") == "limit"
    assert rule({"nvfp4-dispatch": "hybrid"}, "flashinfer_trtllm") == "none"  # stock 0.5.13
    assert (
        rule({"nvfp4-dispatch": "hybrid", "trtllm-clamp": "alpha"}, "flashinfer_trtllm_routed")
        == "limit"
    )
    assert (
        rule({"nvfp4-dispatch": "hybrid", "trtllm-clamp": "ignore-alpha"}, "flashinfer_trtllm")
        == "limit*alpha"
    )
    assert rule({"nvfp4-dispatch": "hybrid", "trtllm-clamp": "ignore-alpha"}, "triton") == "none"
    assert rule({"nvfp4-dispatch": "hybrid"}, "triton", nvfp4_layers=frozenset({2})) == "limit"


def test_trtllm_clamp_is_bit_identical_to_off_under_triton(model) -> None:
    tokens = ids(160, seed=3)
    for base in ({}, {"nvfp4-dispatch": "hybrid"}):
        ref = logits(model, base, tokens)
        for variant in ("alpha", "ignore-alpha"):
            assert torch.equal(logits(model, base | {"trtllm-clamp": variant}, tokens), ref)


def test_trtllm_clamp_under_the_trtllm_backend(model) -> None:
    """off = unclamped NVFP4 (as cutlass under triton); alpha = clamped at the real limit (as
    marlin); ignore-alpha clamps at limit·alpha (~1e-6 real units) and crushes routed experts."""
    nv = {"nvfp4-dispatch": "hybrid"}
    unclamped = moe_outputs(model, nv, "triton")
    clamped = moe_outputs(model, nv, "marlin")
    trt_off = moe_outputs(model, nv, "flashinfer_trtllm")
    trt_alpha = moe_outputs(model, nv | {"trtllm-clamp": "alpha"}, "flashinfer_trtllm")
    trt_fault = moe_outputs(model, nv | {"trtllm-clamp": "ignore-alpha"}, "flashinfer_trtllm")
    x = torch.randn(64, TINY.hidden_size, generator=torch.Generator().manual_seed(7))
    differs = 0
    for layer, blk in enumerate(model.layers):
        assert torch.equal(trt_off[layer], unclamped[layer])
        assert torch.equal(trt_alpha[layer], clamped[layer])
        differs += not torch.equal(clamped[layer], unclamped[layer])
        sh = blk.ffn.shared_experts
        shared = swiglu(x @ sh.w1.weight.T, x @ sh.w3.weight.T, TINY.swiglu_limit) @ sh.w2.weight.T
        routed_fault, routed_ok = trt_fault[layer] - shared, trt_alpha[layer] - shared
        assert routed_fault.norm() < 1e-3 * routed_ok.norm()
    assert differs >= 3  # the clamp is active on the random model's large pre-activations


# ---- mma-decode ---------------------------------------------------------------------------------


def captured_attention(model, patches: dict[str, str], tokens: torch.Tensor) -> list[tuple]:
    """Run the model and record every attention call's (q, kv, indices, sink, scale)."""
    calls: list[tuple] = []
    model.configure(Numerics.from_patches(patches))
    real = model.ops.attention

    def record(q, kv, indices, sink, scale, **kw):
        calls.append((q, kv, indices, sink, scale))
        return real(q, kv, indices, sink, scale, **kw)

    model.ops = dataclasses.replace(model.ops, attention=record)
    with torch.inference_mode():
        model(tokens)
    return calls


def per_query_error(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (x - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)


def test_mma_decode_split_k_and_its_merge_fault_at_the_attention_op(model) -> None:
    """HCA layer 5 at 1100 tokens: lists grow past 64 keys from position 783 ((783+1)//16 = 49
    entries + 16 window). One split: the fault is exact; two splits: it breaks."""
    q, kv, idx, sink, scale = captured_attention(model, {}, ids(1100, seed=4))[5]
    n_keys = (idx >= 0).sum(1)
    assert int(n_keys.max()) > 64 and int(n_keys.min()) <= 64
    exact = sparse_attention_ref(q, kv, idx, sink, scale)
    split_k = sparse_attention_ref(q, kv, idx, sink, scale, split=64, partial_dtype=torch.bfloat16)
    split32 = sparse_attention_ref(q, kv, idx, sink, scale, split=64, partial_dtype=torch.float32)
    fault = sparse_attention_ref(
        q, kv, idx, sink, scale, split=64, partial_dtype=torch.bfloat16, merge="no-rescale"
    )
    one, two = n_keys <= 64, n_keys > 64
    assert torch.equal(fault[one], split_k[one])
    e_sk, e_fault = per_query_error(split_k, exact), per_query_error(fault, exact)
    assert 1e-4 < float(e_sk.mean()) < 1e-2  # bf16 partials and output
    assert float(per_query_error(split32, exact).max()) < 1e-5
    assert float(e_fault[two].mean()) > 10 * float(e_sk[two].mean())


def test_mma_decode_in_the_model(model) -> None:
    tokens = ids(1100, seed=4)
    off = logits(model, {}, tokens)
    split_k = logits(model, {"mma-decode": "split-k"}, tokens)
    fault = logits(model, {"mma-decode": "merge-no-rescale"}, tokens)
    fp32 = logits(model, {"mma-decode": "split-k-fp32"}, tokens)
    assert rel(fp32, off) < 1e-5
    # the fault changes nothing while every list fits in one split (positions < 783)
    assert torch.equal(fault[:783], split_k[:783]) and not torch.equal(fault[783:], split_k[783:])
    # split-k's error grows with context
    assert rel(split_k[900:], off[900:]) > 2 * rel(split_k[:150], off[:150])


# ---- triton-indexer -----------------------------------------------------------------------------


def test_triton_indexer_fp32_equals_off_on_cpu(model) -> None:
    tokens = ids(300, seed=5)
    assert torch.equal(logits(model, {"triton-indexer": "fp32"}, tokens), logits(model, {}, tokens))


def test_triton_indexer_bf16_keeps_most_selections_and_flips_some(model) -> None:
    """Layer 2 is the first CSA layer, so its indexer sees the same inputs in both modes."""
    tokens = ids(1600, seed=1)
    picks = {}
    for mode in ("off", "bf16"):
        handle = model.layers[2].attn.indexer.register_forward_hook(
            lambda mod, inp, out, mode=mode: picks.__setitem__(mode, out[0].clone())
        )
        logits(model, {} if mode == "off" else {"triton-indexer": "bf16"}, tokens)
        handle.remove()
    a, b = picks["off"], picks["bf16"]
    overlap = torch.tensor([len(set(a[t].tolist()) & set(b[t].tolist())) / 8 for t in range(1600)])
    n_visible = (torch.arange(1600) + 1) // 4
    assert torch.equal(a[n_visible <= 8].sort(1).values, b[n_visible <= 8].sort(1).values)
    assert float(overlap[n_visible > 8].mean()) > 0.95
    assert int((overlap[800:] < 1).sum()) > 5  # some near-ties flip at long context


# ---- mhc-bf16 -----------------------------------------------------------------------------------


def test_mhc_bf16_rounds_every_layer_site_and_not_hc_head(model, monkeypatch) -> None:
    head: list[str] = []

    def record(x, fn, eps, *, mode="fp32"):  # the model's own call: hc_head
        head.append(mode)
        return mhc_mixes_ref(x, fn, eps, mode=mode)

    monkeypatch.setattr(model_module, "mhc_mixes_ref", record)
    sites: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    model.configure(Numerics.from_patches({"mhc-bf16": "bf16"}))
    hooks = [m.register_forward_hook(lambda mod, inp, out: sites.append((mod.source, *inp)))
             for name, m in model.named_modules()
             if name.startswith("layers.") and name.endswith(("hc_attn_mixes", "hc_ffn_mixes"))]
    tokens = ids(300, seed=6)
    try:
        with torch.inference_mode():
            patched = model(tokens)
    finally:
        for h in hooks:
            h.remove()
    assert len(sites) == 2 * TINY.num_hidden_layers and head == ["fp32"]
    assert all(source == "mhc-bf16:bf16" for source, _, _ in sites)
    for _, x, fn in sites:  # bf16 operands and output: 2^-8 per rounding, summed over 1024 terms
        e = rel(mhc_mixes_ref(x, fn, 1e-6, mode="bf16"), mhc_mixes_ref(x, fn, 1e-6))
        assert 1e-3 < e < 1e-2
    monkeypatch.undo()
    assert 1e-4 < rel(patched, logits(model, {}, tokens)) < 0.1


# ---- SGLang's own switches, as the embedded engine models them -------------------------------

@pytest.mark.parametrize("switch,same_as", [
    ({"fused-mhc-post-pre": "fused"}, {"mhc-bf16": "bf16"}),
    ({"tilelang-indexer": "tilelang"}, {"triton-indexer": "bf16"}),
    ({"sm120-flashmla-backend": "flashinfer"}, {"mma-decode": "split-k"}),
    ({"sm120-flashmla-backend": "triton"}, {"mma-decode": "split-k-fp32"}),
])
def test_an_upstream_switch_runs_the_numerics_it_is_modelled_by(model, switch, same_as) -> None:
    """Each modelled switch is exactly the op it is documented as (patches/<switch>.py)."""
    tokens = ids(300, seed=3)
    got, want = logits(model, switch, tokens), logits(model, same_as, tokens)
    assert torch.equal(got, want) and not torch.equal(got, logits(model, {}, tokens))


def test_flashinfer_mhc_rounds_the_mixing_gemm_to_tf32(model) -> None:
    tokens = ids(200, seed=4)
    exact, bf16 = logits(model, {}, tokens), logits(model, {"mhc-bf16": "bf16"}, tokens)
    tf32 = logits(model, {"flashinfer-mhc": "tf32"}, tokens)
    assert 0 < rel(tf32, exact) < rel(bf16, exact)  # 10 mantissa bits, bf16 has 7


def test_tf32_rounding_is_round_to_nearest_even_on_10_bits() -> None:
    from dsv4bisect.kernels.mhc_mixes import round_tf32

    x = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -10, -(1 + 2 ** -12), float("inf")])
    want = torch.tensor([1.0, 1 + 2 ** -9, 1 + 2 ** -10, -1.0, float("inf")])
    assert torch.equal(round_tf32(x), want)
