"""The field fault variants (each in its patch's module) act where and only where the field bug
did."""

from __future__ import annotations

import torch

from dsv4bisect.kernels.fp8 import fp8_activation
from dsv4bisect.patches import fp8_wo_a_gemm, mma_decode, triton_indexer
from dsv4bisect.reference.config import ModelArgs, Numerics
from dsv4bisect.reference.swappable import Swappable

TINY = ModelArgs.preset("tiny")


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(2, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def configure(model, variant: str | None, precision: str = "deployment") -> None:
    patches = {} if variant is None else {"mma-decode": variant}
    model.configure(Numerics.from_patches(patches, precision=precision))


def sources(model, patches: dict[str, str], precision: str = "deployment",
            layer: int = 2) -> dict[str, str]:
    """Which patch (or `stock`) put in each swappable place of one layer, and of the model."""
    model.configure(Numerics.from_patches(patches, precision=precision))
    out = {name.removeprefix(f"layers.{layer}."): m.source
           for name, m in model.named_modules() if isinstance(m, Swappable)
           and (name.startswith(f"layers.{layer}.") or "." not in name)}
    comp = model.layers[layer].attn.compressor
    out["compressor.rope"] = "stock" if comp is None or comp.rope is comp.stock_rope else "swap"
    out["window_store"] = model.window_store.__name__
    return out


def prefill_then_decode(model, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a prefill of tokens[:-1] and of one decode step of tokens[-1]."""
    cache = model.new_cache()
    with torch.inference_mode():
        pre = model.logits(model.forward_hidden(tokens[:-1], cache))
        dec = model.logits(model.forward_hidden(tokens[-1:], cache))
    return pre, dec


# ---- triton-indexer:residue (vllm#55927) -------------------------------------------------------


def test_residue_shift_moves_ids_only_at_length_3_mod_4() -> None:
    positions = torch.arange(16, 24)  # lengths 17..24
    ids_ = torch.tensor([0, 2, 3, -1]).expand(1, 8, 4).clone()
    out = triton_indexer.residue_shift(ids_, positions)
    for t, p in enumerate(positions.tolist()):
        if (p + 1) % 4 == 3:  # lengths 19 and 23: 4 and 5 entries visible
            n = (p + 1) // 4
            assert out[0, t].tolist() == [1, 3, min(4, n - 1) if 4 < n else 3, -1]
        else:
            assert torch.equal(out[0, t], ids_[0, t])


def test_residue_runs_the_bf16_kernel_and_shifts_the_selection(model) -> None:
    tokens = ids(40, seed=13)
    out = {}
    for variant in ("bf16", "residue"):
        got = sources(model, {"triton-indexer": variant})
        assert got["attn.indexer.logits"] == f"triton-indexer:{variant}"
        assert got["attn.indexer.selection"] == ("stock" if variant == "bf16" else
                                                 "triton-indexer:residue")
        with torch.inference_mode():
            out[variant] = model.forward(tokens)
    # a CSA layer's first selection with 2 entries is at length 11 (3 mod 4): from there on
    same = [torch.equal(out["bf16"][t], out["residue"][t]) for t in range(40)]
    assert all(same[:10]) and not all(same[10:])


# ---- mma-decode:batch-kv-slot (sglang#33397) ---------------------------------------------------


def test_slot_rows_give_each_later_request_the_previous_ones_first_row() -> None:
    # a group of 2 sequences of 3 tokens, then the decode rows of two more requests
    assert mma_decode.slot_rows([(0, 2, 3), (6, 1, 1), (7, 1, 1)], 8).tolist() == [
        0, 1, 2, 0, 4, 5, 3, 6]
    assert mma_decode.slot_rows([(0, 1, 5)], 5).tolist() == [0, 1, 2, 3, 4]  # one request: own


def test_the_kv_faults_act_only_on_fp8_kv_pages(model) -> None:
    for variant, place in (("batch-kv-slot", "attn.kv_write"), ("decode-rope-fp8", "attn.kv_read")):
        label = f"mma-decode:{variant}"
        deployed, exact = sources(model, {"mma-decode": variant}), \
            sources(model, {"mma-decode": variant}, "exact")
        assert deployed[place] == label and exact[place] == "stock"
        # the kernel itself is the patch's split-K, at both precisions
        assert deployed["attn.core"] == exact["attn.core"] == label


def test_batch_kv_slot_leaves_a_lone_request_exact(model) -> None:
    tokens = ids(40, seed=1)
    configure(model, "split-k")
    want = prefill_then_decode(model, tokens)
    configure(model, "batch-kv-slot")
    for w, g in zip(want, prefill_then_decode(model, tokens), strict=True):
        assert torch.equal(w, g)


def test_batch_kv_slot_changes_only_the_later_requests_of_a_batch(model) -> None:
    a, b = ids(24, seed=2), ids(24, seed=4)
    out = {}
    for variant in ("split-k", "batch-kv-slot"):
        configure(model, variant)
        caches = [model.new_cache(), model.new_cache()]
        with torch.inference_mode():
            out[variant] = model.logits(model.forward_ragged([(a, caches[0]), (b, caches[1])]))
    # the first request moves only by the deployment's own batch variation (its batch mate
    # changes the token-wise kernels' inputs, not its keys); the second reads a foreign key
    torch.testing.assert_close(out["batch-kv-slot"][:24], out["split-k"][:24], rtol=0, atol=1e-4)
    assert float((out["batch-kv-slot"][24:] - out["split-k"][24:]).abs().max()) > 0.1


# ---- mma-decode:decode-rope-fp8 (sglang#25790) -------------------------------------------------


def test_decode_rope_fp8_moves_decode_only_and_only_with_fp8_kv(model) -> None:
    tokens = ids(40, seed=5)
    configure(model, "split-k")
    pre, dec = prefill_then_decode(model, tokens)
    configure(model, "decode-rope-fp8")
    pre_f, dec_f = prefill_then_decode(model, tokens)
    assert torch.equal(pre, pre_f)
    assert not torch.equal(dec, dec_f)
    configure(model, "split-k", "exact")
    exact = prefill_then_decode(model, tokens)
    configure(model, "decode-rope-fp8", "exact")
    for w, g in zip(exact, prefill_then_decode(model, tokens), strict=True):
        assert torch.equal(w, g)


def test_rope_read_as_fp8_keeps_the_nope_dims() -> None:
    kv = torch.randn(3, TINY.head_dim, generator=torch.Generator().manual_seed(6))
    out = mma_decode.rope_read_as_fp8(kv, TINY.qk_rope_head_dim)
    nope = TINY.head_dim - TINY.qk_rope_head_dim
    assert torch.equal(out[:, :nope], kv[:, :nope])
    assert not torch.equal(out[:, nope:], kv[:, nope:])


# ---- mma-decode:compress-rope-base (mlx-lm PR #1189) -------------------------------------------


def test_compress_rope_base_is_a_split_k_fault_at_both_precisions(model) -> None:
    label = "mma-decode:compress-rope-base"
    for precision in ("exact", "deployment"):
        got = sources(model, {"mma-decode": "compress-rope-base"}, precision)
        assert got["compressor.rope"] == "swap" and got["attn.core"] == label
        assert got["window_store"] == "NoWindowStore"
        assert got["attn.kv_write"] == got["attn.kv_read"] == "stock"
    assert sources(model, {"mma-decode": "split-k"})["compressor.rope"] == "stock"


def test_compress_rope_base_rotates_the_kv_entries_with_the_main_base(model) -> None:
    a = model.a
    model.configure(Numerics.from_patches({"mma-decode": "compress-rope-base"}))
    comp = next(blk.attn.compressor for blk in model.layers if blk.attn.compressor is not None)
    want = comp.rope.inv_freq
    main, compress = (1.0 / (base ** (torch.arange(0, a.qk_rope_head_dim, 2) / a.qk_rope_head_dim))
                      for base in (a.rope_theta, a.compress_rope_theta))
    # the highest frequency is the same in both tables; the others are the main base's (YaRN
    # divides only frequencies far below those of the tiny model's 16 rope dims at these bases)
    assert want[0] == 1.0 and torch.allclose(want[1:3], main[1:3]) and \
        not torch.allclose(want[1:3], compress[1:3])


def test_compress_rope_base_is_exact_until_a_rotated_entry_is_visible(model) -> None:
    # a CSA layer's entry 0 sits at position 0 (no rotation in either table); entry 1 (position
    # 4) is first visible to the query at position 7 (length 8)
    tokens = ids(40, seed=7)
    for precision in ("exact", "deployment"):
        configure(model, "split-k", precision)
        want = prefill_then_decode(model, tokens)
        configure(model, "compress-rope-base", precision)
        got = prefill_then_decode(model, tokens)
        # the later rows' new values reach the first ones only through the expert GEMMs' row
        # grouping (which rows share an expert's GEMM; at `exact` too: 3e-6 at row 3 on CPU):
        # rounding, no more
        torch.testing.assert_close(got[0][:7], want[0][:7], rtol=0, atol=1e-4)
        assert float((got[0][7:] - want[0][7:]).abs().max()) > 1e-3
        assert not torch.equal(got[1], want[1])


def test_compress_rope_base_leaves_the_indexer_keys(model) -> None:
    tokens = ids(24, seed=8)
    csa = next(blk.attn for blk in model.layers if blk.attn.indexer is not None)
    entries = {}
    for variant in ("split-k", "compress-rope-base"):
        configure(model, variant, "exact")
        cache = model.new_cache()
        with torch.inference_mode():
            model.forward_hidden(tokens, cache)
        layer = cache.layers[csa.layer_id]
        entries[variant] = (layer.index.entries.view().clone(), layer.comp.entries.view().clone())
    assert torch.equal(entries["split-k"][0], entries["compress-rope-base"][0])
    kv, kv_f = entries["split-k"][1], entries["compress-rope-base"][1]
    assert torch.equal(kv[0], kv_f[0]) and not torch.equal(kv[1:], kv_f[1:])
    nope = TINY.head_dim - TINY.qk_rope_head_dim
    assert torch.equal(kv[:, :nope], kv_f[:, :nope])  # only the rope dims move


# ---- mma-decode:swa-ring-stale (sglang PR #30339; ROCm/ATOM#1417) ------------------------------


def test_swa_rings_hand_out_slots_fifo_and_keep_rows_at_position_mod_window(model) -> None:
    configure(model, None, "exact")
    rings = mma_decode.SwaRings(n_slots=2, window=TINY.sliding_window)
    assert [rings.alloc(), rings.alloc()] == [0, 1]
    cache = model.new_cache()
    with torch.inference_mode():
        model.forward_hidden(ids(40, seed=9), cache)
    rings.release(0, cache)
    assert rings.alloc() == 0  # the only free one
    rings.release(1, None)
    fresh = cache.layers[0].window.clone()
    restored = cache.fork()
    rings.restore(0, restored)  # the occupant's own rows: the same window
    for layer, own in zip(restored.layers, cache.layers, strict=True):
        assert torch.equal(layer.window, own.window)
    assert torch.equal(cache.layers[0].window, fresh)  # the snapshot is not written
    never = cache.fork()
    rings.restore(1, never)  # a slot never used: zeros
    assert all(float(layer.window.abs().max()) == 0.0 for layer in never.layers)


def test_swa_ring_stale_moves_only_requests_that_hit_a_foreign_ring() -> None:
    from dsv4bisect.reference.engine import ReferenceEngine
    from dsv4bisect.reference.prefix_cache import PrefixCache
    from dsv4bisect.reference.request import Request
    from dsv4bisect.reference.scheduler import Scheduler

    def conversation(variant: str, max_running: int) -> list[list[float]]:
        engine = ReferenceEngine.load(None, patches={"mma-decode": variant}, precision="exact",
                                      device="cpu")
        sched = Scheduler(engine, chunk_size=64, max_running_requests=max_running,
                          prefix_cache=PrefixCache(), background=False)
        first = Request(tuple(ids(60, seed=10).tolist()), 6, frozenset())
        sched.submit(first)
        while sched.step() is not None:
            pass
        second = Request(first.ids + tuple(first.output_ids) + tuple(ids(12, seed=11).tolist()),
                         6, frozenset())
        sched.submit(second)
        while sched.step() is not None:
            pass
        assert second.cached_tokens == 60 + 5
        return [first.logprobs, second.logprobs]

    want = conversation("split-k", 2)
    # one slot: the hit resumes in the slot its own first turn left, whose ring holds its window
    assert conversation("swa-ring-stale", 1) == want
    # two slots: the hit gets the slot never used (SGLang's free list is first in, first out)
    stale = conversation("swa-ring-stale", 2)
    assert stale[0] == want[0] and stale[1] != want[1]


def test_swa_ring_stale_corrupts_a_retry_after_its_first_token() -> None:
    """The same prompt sent again (a retry) resumes whole from its snapshot: with the fault the
    window comes from a slot never used, so every token after the first (taken from the
    snapshot's logits) reads a zero window, ATOM#1417's repeated prompt; without it the retry
    answers as the first send."""
    from dsv4bisect.reference.engine import ReferenceEngine
    from dsv4bisect.reference.prefix_cache import PrefixCache
    from dsv4bisect.reference.request import Request
    from dsv4bisect.reference.scheduler import Scheduler

    def sends(variant: str) -> list[tuple[int, list[float]]]:
        engine = ReferenceEngine.load(None, patches={"mma-decode": variant}, precision="exact",
                                      device="cpu")
        sched = Scheduler(engine, prefix_cache=PrefixCache(), background=False)
        prompt = tuple(ids(60, seed=12).tolist())
        out = []
        for r in (Request(prompt, 6, frozenset()), Request(prompt, 6, frozenset())):
            sched.submit(r)
            while sched.step() is not None:
                pass
            out.append((r.cached_tokens, r.logprobs))
        return out

    (c0, cold), (c1, retry) = sends("split-k")
    assert (c0, c1) == (0, 60) and retry == cold
    (_, cold_f), (hit, retry_f) = sends("swa-ring-stale")
    assert hit == 60 and cold_f == cold
    assert retry_f[0] == cold[0] and retry_f[1:] != cold[1:]


def test_the_sglang_hook_refuses_the_embedded_only_faults() -> None:
    from dsv4bisect.sglang_hooks.attention import decode_plan

    for variant in ("compress-rope-base", "swa-ring-stale"):
        assert decode_plan(variant, "0.5.13", None).action == "refuse"


# ---- fp8-wo-a-gemm and its faults (sglang#29038, sglang#39193) ---------------------------------


def wo_a_configure(model, variant: str | None, precision: str = "deployment") -> None:
    patches = {} if variant is None else {"fp8-wo-a-gemm": variant}
    model.configure(Numerics.from_patches(patches, precision=precision))


def test_wo_a_input_modes_follow_the_patch_at_deployment_only(model) -> None:
    def source(variant, precision):
        patches = {} if variant is None else {"fp8-wo-a-gemm": variant}
        return sources(model, patches, precision)["attn.wo_a_input"]

    assert source(None, "deployment") == "stock"  # SGLang's stock path: bf16 einsum
    for v in ("fp8", "scale-layout", "scale-truncate"):
        assert source(v, "deployment") == f"fp8-wo-a-gemm:{v}"
        assert source(v, "exact") == "stock"


def test_wo_a_input_off_is_bf16_on_is_fp8_of_it(model) -> None:
    o = torch.randn(6, 2, 128, generator=torch.Generator().manual_seed(3))

    def read(variant, precision="deployment"):
        sources(model, {} if variant is None else {"fp8-wo-a-gemm": variant}, precision)
        return model.layers[2].attn.wo_a_input(o)

    assert torch.equal(read(None, "exact"), o)
    bf16 = o.bfloat16().float()
    assert torch.equal(read(None), bf16) and not torch.equal(bf16, o)
    fp8 = read("fp8")
    assert torch.equal(fp8, fp8_activation(bf16))
    assert not torch.equal(fp8, bf16)


def test_scale_layout_reads_the_scale_of_flat_row_g_times_t_plus_t() -> None:
    T, G = 3, 2
    # (t, g) has amax 2^(t·G + g): its UE8M0 scale is unique per flat row t·G + g
    o = torch.zeros(T, G, 128)
    for t in range(T):
        for g in range(G):
            o[t, g, 0] = 2.0 ** (t * G + g)
    got, right = fp8_wo_a_gemm.scale_layout(o), fp8_activation(o)
    for t in range(T):
        for g in range(G):
            read = g * T + t  # the kernel's group-major row
            assert got[t, g, 0] == right[t, g, 0] * 2.0 ** (read - (t * G + g))
    assert torch.equal(got[0, 0], right[0, 0]) and torch.equal(got[T - 1, G - 1], right[-1, -1])


def test_scale_layout_is_exact_for_one_token_and_wrong_for_several() -> None:
    o = torch.randn(7, 2, 128, generator=torch.Generator().manual_seed(5))
    o = o * torch.tensor([1.0, 9.0])[None, :, None]  # groups of different amax
    assert torch.equal(fp8_wo_a_gemm.scale_layout(o[:1]), fp8_activation(o[:1]))
    assert not torch.equal(fp8_wo_a_gemm.scale_layout(o), fp8_activation(o))


def test_scale_truncate_reads_half_to_all_of_each_block() -> None:
    o = torch.randn(4, 2, 256, generator=torch.Generator().manual_seed(6)) * 3
    got = fp8_wo_a_gemm.scale_truncate(o)
    amax = o.unflatten(-1, (-1, 128)).abs().amax(-1)  # [4, 2, 2]
    scale = amax / 448
    factor = (torch.exp2(torch.floor(torch.log2(scale))) / scale)[..., None]  # (0.5, 1]
    codes = (o.unflatten(-1, (-1, 128)) / scale[..., None]).to(torch.float8_e4m3fn).float()
    read = torch.exp2(torch.floor(torch.log2(scale)))[..., None]  # = scale · factor
    assert torch.equal(got, (codes * read).flatten(-2))
    assert bool((factor > 0.5).all() and (factor <= 1).all() and (factor < 1).any())
    # a scale that is a power of two already loses nothing
    p2 = torch.zeros(1, 1, 128)
    p2[0, 0, :2] = torch.tensor([448.0 * 4, 3.0])
    assert torch.equal(fp8_wo_a_gemm.scale_truncate(p2)[0, 0, :2], p2[0, 0, :2])


def test_fp8_wo_a_gemm_changes_deployment_logits_only(model) -> None:
    tokens = ids(24, seed=2)
    out = {}
    for precision in ("deployment", "exact"):
        for variant in (None, "fp8"):
            wo_a_configure(model, variant, precision)
            with torch.inference_mode():
                out[precision, variant] = model.forward(tokens)
    assert not torch.equal(out["deployment", None], out["deployment", "fp8"])
    assert torch.equal(out["exact", None], out["exact", "fp8"])


def test_scale_layout_prefill_is_wrong_a_one_token_forward_exact(model) -> None:
    tokens = ids(40, seed=3)
    out = {}
    for variant in ("fp8", "scale-layout"):
        wo_a_configure(model, variant)
        with torch.inference_mode():
            out[variant] = (model.forward(tokens), model.forward(tokens[:1]))
    assert not torch.equal(out["fp8"][0], out["scale-layout"][0])  # prefill: T = 40 rows
    assert torch.equal(out["fp8"][1], out["scale-layout"][1])  # T = 1


def test_scale_layout_decode_step_of_a_lone_request_is_exact(model) -> None:
    """A decode step (T = 1) on a cache the right FP8 path wrote: exact under the fault."""
    import copy

    tokens = ids(30, seed=4)
    wo_a_configure(model, "fp8")
    cache = model.new_cache()
    with torch.inference_mode():
        model.forward_hidden(tokens[:-1], cache)
        snapshot = copy.deepcopy(cache)
        want = model.logits(model.forward_hidden(tokens[-1:], cache))
        wo_a_configure(model, "scale-layout")
        got = model.logits(model.forward_hidden(tokens[-1:], snapshot))
    assert torch.equal(got, want)


def test_scale_layout_batched_decode_is_wrong(model) -> None:
    """Several requests decoding in one forward: T = batch > 1, scales read across requests."""
    import copy

    wo_a_configure(model, "fp8")
    caches = []
    with torch.inference_mode():
        for seed in (5, 6, 7):
            c = model.new_cache()
            model.forward_hidden(ids(20, seed), c)
            caches.append(c)
    step = [(ids(1, 10 + i), c) for i, c in enumerate(caches)]
    with torch.inference_mode():
        want = model.logits(model.forward_ragged([(t, copy.deepcopy(c)) for t, c in step]))
        wo_a_configure(model, "scale-layout")
        got = model.logits(model.forward_ragged([(t, copy.deepcopy(c)) for t, c in step]))
    assert not torch.equal(got, want)
