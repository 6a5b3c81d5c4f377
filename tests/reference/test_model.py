"""The embedded DeepSeek-V4: config, RoPE/YaRN, compressors, key lists, mHC, MoE, causality and
chunked/incremental processing against a full recompute."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from dsv4bisect.errors import ConfigError
from dsv4bisect.reference.checkpoint import init_module, random_model
from dsv4bisect.reference.config import ModelArgs, Numerics
from dsv4bisect.reference.model import (
    Rope,
    apply_rope,
    build_block,
    hc_split_sinkhorn,
    key_lists,
    swiglu,
)

TINY = ModelArgs.preset("tiny")


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


# ---- config -------------------------------------------------------------------------------------


def test_flash_preset_is_deepseek_v4_flash() -> None:
    f = ModelArgs.preset("flash")
    assert (f.hidden_size, f.num_hidden_layers, f.num_attention_heads, f.head_dim) == (
        4096,
        43,
        64,
        512,
    )
    assert f.compress_ratios == (0, 0) + (4, 128) * 20 + (4, 0)
    assert [f.layer_kind(i) for i in (0, 1, 2, 3, 42, 43)] == [
        "swa",
        "swa",
        "csa",
        "hca",
        "csa",
        "swa",
    ]
    assert (f.index_topk, f.n_routed_experts, f.num_experts_per_tok, f.routed_scaling_factor) == (
        512,
        256,
        6,
        1.5,
    )
    assert f.rope_scaling is not None and f.rope_scaling.factor == 16
    assert f.compress_rope_theta == 160000 and f.rope_theta == 10000


@pytest.mark.parametrize("name", ["tiny", "flash"])
def test_hf_config_round_trip(name: str) -> None:
    a = ModelArgs.preset(name)
    hf = a.to_hf_config()
    assert hf["model_type"] == "deepseek_v4" and hf["compress_ratios"] == list(a.compress_ratios)
    assert ModelArgs.from_hf_config(hf) == a


def test_from_hf_config_reads_the_official_layout() -> None:
    """Extra keys of the shipped config.json (quantization, dtype) are ignored; eos may be a list."""
    cfg = ModelArgs.preset("flash").to_hf_config() | {
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        "expert_dtype": "fp4",
        "eos_token_id": [1],
        "rope_scaling": {
            "type": "yarn",
            "factor": 16,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    }
    assert ModelArgs.from_hf_config(cfg) == ModelArgs.preset("flash")


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"compress_ratios": [0, 4]}, "compress_ratios"),
        ({"hidden_size": "4096"}, "hidden_size"),
        ({"compress_ratios": [0, 1, 4, 4, 4, 4, 0]}, "compress_ratios"),
        ({"num_attention_heads": 3}, "o_groups"),
        ({"model_type": "llama"}, "model_type"),
    ],
)
def test_invalid_config_is_a_config_error(patch: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ModelArgs.from_hf_config(TINY.to_hf_config() | patch)


def test_any_layer_count_and_ratios_work() -> None:
    a = TINY.with_(
        num_hidden_layers=3,
        compress_ratios=(8, 4, 0),
        num_hash_layers=1,
        num_nextn_predict_layers=0,
    )
    m = random_model(a, seed=3)
    m.configure(Numerics())
    assert [m.a.layer_kind(i) for i in range(3)] == ["hca", "csa", "swa"]
    ids = tokens(70)
    full = m(ids)
    cache = m.new_cache()
    parts = [m.logits(m.forward_hidden(ids[s : s + 9], cache)) for s in range(0, 70, 9)]
    assert torch.isfinite(full).all()
    torch.testing.assert_close(torch.cat(parts), full, rtol=0, atol=1e-4)


# ---- RoPE ---------------------------------------------------------------------------------------


def test_yarn_frequencies_of_flash() -> None:
    """Hand-derived for dim 64, base 160000, factor 16, original 65536, beta 32/1: the
    correction range is pairs [15, 25]; below it frequencies stay, above they are /16."""
    f = ModelArgs.preset("flash")
    rope = Rope(64, f.compress_rope_theta, f.rope_scaling)
    plain = 1.0 / (160000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    got = rope.inv_freq.double()
    torch.testing.assert_close(got[:16], plain[:16], rtol=1e-6, atol=0)
    torch.testing.assert_close(got[25:], plain[25:] / 16, rtol=1e-6, atol=0)
    torch.testing.assert_close(got[20], plain[20] * (0.5 + 0.5 / 16), rtol=1e-6, atol=0)
    main = Rope(64, f.rope_theta, None)  # SWA-only layers: base 10000, no YaRN
    torch.testing.assert_close(
        main.inv_freq.double(),
        1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64),
        rtol=1e-6,
        atol=0,
    )


def test_rope_is_an_interleaved_rotation_of_the_last_dims() -> None:
    rope = Rope(16, 10000.0, None)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 64, generator=g), torch.randn(1, 64, generator=g)

    def at(x: torch.Tensor, p: int) -> torch.Tensor:
        return apply_rope(x, *rope.cos_sin(torch.tensor([p])))

    # complex view: pairs (2i, 2i+1) of the last 16 dims turn by p·θ_i; nope dims untouched
    z = torch.view_as_complex(q[0, -16:].double().view(8, 2)) * torch.polar(
        torch.ones(8, dtype=torch.float64), 7 * rope.inv_freq.double()
    )
    torch.testing.assert_close(
        at(q, 7)[0, -16:].double(), torch.view_as_real(z).flatten(), rtol=1e-5, atol=1e-5
    )
    assert torch.equal(at(q, 7)[0, :48], q[0, :48])
    # relative: q(p)·k(p') depends on p - p' only; the inverse undoes it
    assert math.isclose(
        float(at(q, 9) @ at(k, 4).T), float(at(q, 105) @ at(k, 100).T), rel_tol=1e-4
    )
    back = apply_rope(at(q, 33), *rope.cos_sin(torch.tensor([33])), inverse=True)
    torch.testing.assert_close(back, q, rtol=1e-5, atol=1e-5)


# ---- compressed KV ------------------------------------------------------------------------------


def direct_entries(comp, x: torch.Tensor, rope: Rope, eps: float) -> torch.Tensor:
    """Entries written out window by window, slot by slot (the paper's formulas)."""
    r, d = comp.ratio, comp.head_dim
    kv, sc = x @ comp.wkv.weight.T, x @ comp.wgate.weight.T
    out = []
    for w in range(x.shape[0] // r):
        slots_kv, slots_sc = [], []
        if comp.overlap:  # Ca (first half) of window w-1, then Cb (second half) of window w
            for j in range(r):
                t = (w - 1) * r + j
                slots_kv.append(kv[t, :d] if w else torch.zeros(d))
                slots_sc.append(sc[t, :d] + comp.ape[j, :d] if w else torch.full((d,), -math.inf))
            for j in range(r):
                slots_kv.append(kv[w * r + j, d:])
                slots_sc.append(sc[w * r + j, d:] + comp.ape[j, d:])
        else:
            for j in range(r):
                slots_kv.append(kv[w * r + j])
                slots_sc.append(sc[w * r + j] + comp.ape[j])
        weights = torch.softmax(torch.stack(slots_sc), dim=0)  # per channel over the slots
        c = (weights * torch.stack(slots_kv)).sum(0)
        c = c * torch.rsqrt(c.square().mean() + eps) * comp.norm.weight
        rd = rope.inv_freq.shape[0] * 2
        z = torch.view_as_complex(c[-rd:].double().reshape(-1, 2))
        z = z * torch.polar(
            torch.ones_like(rope.inv_freq.double()), (w * r) * rope.inv_freq.double()
        )
        out.append(torch.cat((c[:-rd], torch.view_as_real(z).flatten().float())))
    return torch.stack(out)


@pytest.mark.parametrize(("layer", "part"), [(2, "attn"), (2, "indexer"), (3, "attn")])
def test_compressor_matches_the_per_window_formula_in_chunks(model, layer: int, part: str) -> None:
    attn = model.layers[layer].attn
    comp = attn.indexer.compressor if part == "indexer" else attn.compressor
    x = torch.randn(90, TINY.hidden_size, generator=torch.Generator().manual_seed(layer))
    want = direct_entries(comp, x, model.rope_compress, TINY.rms_norm_eps)
    for chunk in (90, 7, 1):  # one pass, chunks that split windows, token by token
        state = comp.new_state(x.device)
        for s in range(0, 90, chunk):  # one sequence: x [1, chunk, dim], a list of one state
            comp(x[None, s : s + chunk], model._step(tokens(90)[s : s + chunk], s), [state])
        assert state.n_entries == 90 // comp.ratio
        torch.testing.assert_close(state.entries.view(), want, rtol=1e-5, atol=1e-5)


def test_key_lists_are_compressed_entries_then_the_window() -> None:
    pos = torch.tensor([0, 5, 17, 40])
    window_start, comp_row0, win = 20, 100, 16  # pool rows: window rows 0.., entries 100..
    n_comp = (pos + 1) // 16  # HCA ratio 16: entries 0..n-1 visible
    idx = key_lists(pos, win, 0, comp_row0, n_comp, None)
    assert idx[0].tolist()[:1] == [0] and (idx[0, 1:] == -1).all()  # only itself
    assert idx[2].tolist()[:17] == [100] + list(range(2, 18))  # entry 0, tokens 2..17
    assert idx[3].tolist()[:18] == [100, 101] + list(range(25, 41))
    # CSA: the indexer's ids (valid first) replace "all visible"
    ids = torch.tensor([[-1, -1], [-1, -1], [-1, -1], [7, 3]])
    idx = key_lists(pos, win, window_start, comp_row0, (ids >= 0).sum(1), ids)
    assert idx[3].tolist() == [107, 103] + [p - window_start for p in range(25, 41)]
    assert idx[1].tolist()[:6] == [p - window_start for p in range(0, 6)]


# ---- full recompute vs chunks and decode --------------------------------------------------------


def test_future_tokens_do_not_change_past_logits(model) -> None:
    a, b = tokens(200, seed=1), tokens(200, seed=1).clone()
    b[150:] = tokens(50, seed=9)
    la, lb = model(a), model(b)
    # The past equals up to fp32 round-off, not bit for bit: a token's routed-expert GEMM has
    # the tokens routed with it as rows, and some CPUs' kernels (MKL on AVX-512) block the sum
    # by the row count. A leak of the future would move the past far beyond this.
    torch.testing.assert_close(la[:150], lb[:150], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(la[150:], lb[150:])


def compressed_states(cache) -> list[torch.Tensor]:
    return [s.entries.view() for lc in cache.layers for s in (lc.comp, lc.index) if s is not None]


@pytest.mark.parametrize("chunk", [7, 64])
def test_chunked_prefill_and_decode_match_full_recompute(model, chunk: int) -> None:
    """300 tokens cross CSA (4), HCA (16) windows, the 16-token window and chunk boundaries
    (7 splits windows, 64 does not); the last 20 tokens are decoded one at a time."""
    ids = tokens(300, seed=2)
    full_cache = model.new_cache()
    full = model.logits(model.forward_hidden(ids, full_cache))
    cache, parts = model.new_cache(), []
    for s in range(0, 280, chunk):
        parts.append(model.logits(model.forward_hidden(ids[s : min(s + chunk, 280)], cache)))
    for t in range(280, 300):
        parts.append(model.logits(model.forward_hidden(ids[t : t + 1], cache)))
    torch.testing.assert_close(torch.cat(parts), full, rtol=0, atol=1e-4)
    for got, want in zip(compressed_states(cache), compressed_states(full_cache), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # fp32 re-association
    assert cache.n_tokens == 300 and all(lc.window.shape[0] == 15 for lc in cache.layers)


def test_a_ragged_batch_equals_each_sequence_alone(model) -> None:
    """Three sequences at different positions with different chunk lengths (a prefill chunk, a
    decode token, a chunk that splits windows) in one forward equal each run alone, and their
    caches end in the same state (equal up to fp32 reordering of the batched GEMMs)."""
    seqs = [tokens(120, seed=s) for s in (3, 4, 5)]
    plan = [(0, 70, 120), (0, 99, 100), (0, 33, 50)]  # (start, split, end) per sequence
    alone, batched = [model.new_cache() for _ in seqs], [model.new_cache() for _ in seqs]
    for ids, (s, m, _), a, b in zip(seqs, plan, alone, batched, strict=True):
        model.forward_hidden(ids[s:m], a)
        model.forward_hidden(ids[s:m], b)
    want = torch.cat([model.logits(model.forward_hidden(ids[m:e], a))
                      for ids, (_, m, e), a in zip(seqs, plan, alone, strict=True)])
    got = model.logits(model.forward_ragged(
        [(ids[m:e], b) for ids, (_, m, e), b in zip(seqs, plan, batched, strict=True)]))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    for a, b in zip(alone, batched, strict=True):
        assert a.n_tokens == b.n_tokens
        for x, y in zip(compressed_states(a), compressed_states(b), strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


# ---- mHC and MoE --------------------------------------------------------------------------------


def test_sinkhorn_comb_is_doubly_stochastic() -> None:
    n = 4
    g = torch.Generator().manual_seed(0)
    mixes = torch.randn(50, (2 + n) * n, generator=g)
    pre, post, comb = hc_split_sinkhorn(mixes, torch.ones(3), torch.zeros((2 + n) * n), n, 20, 1e-6)
    torch.testing.assert_close(comb.sum(-2), torch.ones(50, n), rtol=0, atol=1e-5)  # last step
    torch.testing.assert_close(comb.sum(-1), torch.ones(50, n), rtol=0, atol=1e-3)
    assert ((pre > 0) & (pre < 1.01)).all() and ((post > 0) & (post < 2)).all()


def test_moe_routes_and_scales_exactly_once(model) -> None:
    x = torch.randn(40, TINY.hidden_size, generator=torch.Generator().manual_seed(5))
    toks = tokens(40, seed=5)
    step = model._step(toks, 0)
    for layer in (0, 4):  # a hash-routed and a score-routed layer
        moe = model.layers[layer].ffn
        scores = torch.nn.functional.softplus(x @ moe.gate.weight.T).sqrt()
        if moe.gate.is_hash:
            ids = moe.gate.tid2eid[toks]
        else:
            ids = torch.topk(scores + moe.gate.bias, TINY.num_experts_per_tok, dim=-1).indices
        w = scores.gather(1, ids)
        w = w / w.sum(-1, keepdim=True)
        want = torch.zeros_like(x)
        for t in range(40):
            for k in range(TINY.num_experts_per_tok):
                ex = moe.experts[str(int(ids[t, k]))]
                h = swiglu(x[t] @ ex.w1.weight.T, x[t] @ ex.w3.weight.T, TINY.swiglu_limit)
                want[t] += TINY.routed_scaling_factor * w[t, k] * (h @ ex.w2.weight.T)
        sh = moe.shared_experts
        want += swiglu(x @ sh.w1.weight.T, x @ sh.w3.weight.T, TINY.swiglu_limit) @ sh.w2.weight.T
        torch.testing.assert_close(moe(x, step), want, rtol=1e-5, atol=1e-5)


def test_swiglu_clamps_gate_above_and_up_both_sides() -> None:
    gate, up = torch.tensor([12.0, -30.0, 3.0]), torch.tensor([15.0, -20.0, 2.0])
    got = swiglu(gate, up, 10.0)
    want = torch.nn.functional.silu(torch.tensor([10.0, -30.0, 3.0])) * torch.tensor(
        [10.0, -10.0, 2.0]
    )
    torch.testing.assert_close(got, want)


def test_mtp_module_runs(model) -> None:
    ids = tokens(41)
    h = model.forward_hidden(ids[:-1], model.new_cache())
    logits = model.mtp_logits(h, ids[1:])
    assert logits.shape == (40, TINY.vocab_size) and torch.isfinite(logits).all()


def test_flash_layer_has_the_real_shapes() -> None:
    """A real DeepSeek-V4-Flash CSA layer (two experts built) and its tensor names."""
    f = ModelArgs.preset("flash")
    block = build_block(f, 2, expert_ids=[0, 255])
    shapes = {k: tuple(v.shape) for k, v in block.state_dict().items()}
    assert shapes["attn.wq_b.weight"] == (64 * 512, 1024)
    assert shapes["attn.wo_a.weight"] == (8 * 1024, 64 * 512 // 8)
    assert shapes["attn.compressor.wkv.weight"] == (2 * 512, 4096)
    assert shapes["attn.compressor.ape"] == (4, 1024)
    assert shapes["attn.indexer.wq_b.weight"] == (64 * 128, 1024)
    assert shapes["attn.indexer.compressor.ape"] == (4, 256)
    assert shapes["attn.attn_sink"] == (64,)
    assert shapes["hc_attn_fn"] == (24, 4 * 4096)
    assert shapes["ffn.gate.tid2eid"] == (129280, 6)
    assert shapes["ffn.experts.255.w2.weight"] == (4096, 2048)
    hca = build_block(f, 3, expert_ids=[])
    assert dict(hca.state_dict())["attn.compressor.ape"].shape == (128, 512)
    assert "attn.indexer.wq_b.weight" not in hca.state_dict()
    assert "ffn.gate.bias" in hca.state_dict() and "ffn.gate.tid2eid" not in hca.state_dict()


def test_flash_attention_sublayer_runs_on_a_few_tokens() -> None:
    f = ModelArgs.preset("flash")
    block = build_block(f, 3, expert_ids=[])
    init_module(block.attn, f, seed=1, prefix="layers.3.attn.")
    m = random_model(TINY)  # only for its Step helper, with flash's RoPE
    m.rope_compress = Rope(f.qk_rope_head_dim, f.compress_rope_theta, f.rope_scaling)
    m.rope_main = Rope(f.qk_rope_head_dim, f.rope_theta, None)
    x = torch.randn(6, f.hidden_size, generator=torch.Generator().manual_seed(0))
    out = block.attn(
        x, m._step(torch.zeros(6, dtype=torch.long), 0), block.attn.new_cache(x.device)
    )
    assert out.shape == (6, f.hidden_size) and torch.isfinite(out).all()


_TRITON_CHECK = """
import torch
from dsv4bisect.kernels.indexer import indexer_logits
from dsv4bisect.kernels.sparse_attention import sparse_attention
from dsv4bisect.reference.checkpoint import random_model
from dsv4bisect.reference.config import ModelArgs, Numerics
from dsv4bisect.reference.model import Ops

torch.set_num_threads(1)
model = random_model(ModelArgs.preset("tiny"), seed=0)
ids = torch.randint(2, 512, (48,), generator=torch.Generator().manual_seed(4))
for patches in ({}, {"mma-decode": "split-k-fp32", "triton-indexer": "fp32"}):
    model.configure(Numerics.from_patches(patches))
    want = model(ids)
    model.ops = Ops(sparse_attention, indexer_logits, indexer_logits)
    print(float((model(ids) - want).norm() / want.norm()))
"""


@pytest.mark.slow
def test_the_triton_wrappers_plug_into_the_model() -> None:
    """The CUDA path's kernels, interpreted on CPU (TRITON_INTERPRET must be set before Triton
    is imported, hence a fresh process), give the reference path's logits."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", _TRITON_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    errors = [float(line) for line in run.stdout.split()]
    assert len(errors) == 2 and max(errors) < 1e-5
