"""SGLang's token-count dispatch (reference/dispatch.py: the mHC pre-norm GEMM, FlashMLA's
split-KV schedule) and the engine's use of it: at `precision: deployment` the logits depend on how
many tokens a forward carries, at `exact` only up to fp32 reordering."""

from __future__ import annotations

import pytest
import torch

from dsv4bisect.kernels.mhc_mixes import mhc_mixes_ref, mhc_mixes_split_ref
from dsv4bisect.kernels.sparse_attention import sparse_attention_ref, sparse_attention_segmented_ref
from dsv4bisect.reference import swappable as swappable_module
from dsv4bisect.reference.config import CSA_RATIO, ModelArgs, Numerics
from dsv4bisect.reference.dispatch import (
    FLASH,
    DispatchShapes,
    MhcPrePlan,
    fit_cut,
    fit_mhc_plan,
    flash_lists,
    flashmla_keys,
    flashmla_segments,
    flashmla_split_points,
    mhc_pre_num_splits,
    mhc_pre_plan,
)
from dsv4bisect.reference.model import Transformer, hc_pre
from dsv4bisect.reference.swappable import stock_mixes

FLASH_K = 4 * 4096  # DeepSeek-V4-Flash: hc_mult · hidden_size
TINY_K = 4 * 256


@pytest.mark.parametrize(("tokens", "k", "sms", "splits"), [
    # Flash on an H200: capped at num_block_k // 4 = 64 while one 64-token tile fills the GPU
    (1, FLASH_K, 132, 64), (64, FLASH_K, 132, 64), (128, FLASH_K, 132, 64),
    (129, FLASH_K, 132, 44),  # three token tiles: 132 // 3
    (2048, FLASH_K, 132, 4), (8448, FLASH_K, 132, 1),
    (8449, FLASH_K, 132, 1),  # 132 // 133 = 0 -> at least one split
    (1, FLASH_K, 188, 64), (2048, FLASH_K, 188, 5),  # an RTX PRO 6000 (SM120)
    # the embedded checkpoint: 16 K blocks, so 4 splits up to 33 token tiles
    (1, TINY_K, 132, 4), (2112, TINY_K, 132, 4), (2113, TINY_K, 132, 3),
    (4224, TINY_K, 132, 2), (4225, TINY_K, 132, 1),
])
def test_split_count_is_sglangs_compute_num_split_for_mhc_pre(tokens: int, k: int, sms: int,
                                                              splits: int) -> None:
    assert mhc_pre_num_splits(tokens, k, sms) == splits


def test_the_fused_boundary_takes_the_fma_kernel_up_to_32_tokens_then_the_tf32_gemm() -> None:
    plan = lambda t, hidden=256, first=False, release="0.5.23": mhc_pre_plan(
        t, 4, hidden, first=first, release=release)
    assert plan(1) == MhcPrePlan("fma", 8)
    assert plan(7) == MhcPrePlan("fma", 8)
    assert plan(8) == MhcPrePlan("fma", 4)
    assert plan(32) == MhcPrePlan("fma", 4)
    assert plan(33) == MhcPrePlan("tf32", 4)
    assert plan(7, hidden=7168) == MhcPrePlan("fma", 4)  # 8 splits only for hidden <= 4096
    assert plan(1, hidden=4096) == MhcPrePlan("fma", 8)
    assert plan(33, hidden=4096) == MhcPrePlan("tf32", 64)
    # the model's first hc_pre has no post before it: mhc_pre, the TF32 GEMM at any size
    assert plan(1, first=True) == MhcPrePlan("tf32", 4)
    # 0.5.13: SGLANG_OPT_FUSE_MHC_POST_PRE defaults to False, every hc_pre is mhc_pre
    assert plan(1, release="0.5.13") == MhcPrePlan("tf32", 4)
    with pytest.raises(ValueError, match="0.5.99"):
        plan(1, release="0.5.99")


def _inputs(t: int = 40, n: int = 4, d: int = 256, seed: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, n * d, generator=g), torch.randn(24, n * d, generator=g) * 0.02


@pytest.mark.parametrize("kernel", ["tf32", "fma"])
@pytest.mark.parametrize("splits", [1, 3, 4, 8])
def test_split_mixes_are_the_formula_in_float64_to_the_kernels_precision(kernel: str,
                                                                         splits: int) -> None:
    x, fn = _inputs()
    want = (x.double() @ fn.double().T) * torch.rsqrt(x.double().square().mean(-1, True) + 1e-6)
    got = mhc_mixes_split_ref(x, fn, 1e-6, n_splits=splits, kernel=kernel, hc_mult=4)
    tol = 2e-3 if kernel == "tf32" else 1e-5  # TF32 keeps 10 mantissa bits of each operand
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())


def test_one_split_equals_the_unsplit_reference_of_the_same_operand_precision() -> None:
    x, fn = _inputs()
    fma = mhc_mixes_split_ref(x, fn, 1e-6, n_splits=1, kernel="fma", hc_mult=4)
    tf32 = mhc_mixes_split_ref(x, fn, 1e-6, n_splits=1, kernel="tf32", hc_mult=4)
    torch.testing.assert_close(fma, mhc_mixes_ref(x, fn, 1e-6, mode="fp32"), rtol=1e-6, atol=1e-6)
    # TF32: fn rounded for the MMA; x is bf16 on SGLang (exact in TF32), taken as it is
    xb = x.bfloat16().float()
    want = mhc_mixes_ref(xb, fn, 1e-6, mode="tf32")  # rounds both; xb is a TF32 value already
    got = mhc_mixes_split_ref(xb, fn, 1e-6, n_splits=1, kernel="tf32", hc_mult=4)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert not torch.equal(tf32, fma)


def test_the_split_changes_the_order_and_the_kernel_changes_the_operands() -> None:
    x, fn = _inputs()
    f4 = mhc_mixes_split_ref(x, fn, 1e-6, n_splits=4, kernel="fma", hc_mult=4)
    f8 = mhc_mixes_split_ref(x, fn, 1e-6, n_splits=8, kernel="fma", hc_mult=4)
    t4 = mhc_mixes_split_ref(x, fn, 1e-6, n_splits=4, kernel="tf32", hc_mult=4)
    assert not torch.equal(f4, f8)  # another fp32 summation order ...
    assert (f4 - f8).abs().max() < 1e-5 * f4.abs().max()  # ... and only that
    assert (f4 - t4).abs().max() > 1e-5 * f4.abs().max()  # TF32 operands move it more
    with pytest.raises(ValueError, match="kernel"):
        mhc_mixes_split_ref(x, fn, 1e-6, n_splits=4, kernel="bf16", hc_mult=4)


def test_hc_pre_at_deployment_gives_a_token_another_mix_at_33_tokens_than_at_32(
        model: Transformer) -> None:
    """The same 32 rows, alone (FMA kernel) and with one more token (TF32 GEMM)."""
    a: ModelArgs = model.a
    blk = model.layers[1]
    h = torch.randn(33, a.hc_mult, a.hidden_size, generator=torch.Generator().manual_seed(1))
    args = (blk.hc_ffn_fn, blk.hc_ffn_scale, blk.hc_ffn_base, a)
    deployed, exact = stock_mixes(a, True, False), stock_mixes(a, False, False)
    small = hc_pre(h[:32], *args, deployed)
    large = hc_pre(h, *args, deployed)
    assert not torch.equal(small[0], large[0][:32])
    exact_small, exact_large = hc_pre(h[:32], *args, exact), hc_pre(h, *args, exact)
    for s, big in zip(exact_small, exact_large, strict=True):
        torch.testing.assert_close(s, big[:32], rtol=1e-6, atol=1e-6)


def _chunked(model: Transformer, tokens: torch.Tensor, chunk: int) -> torch.Tensor:
    with torch.inference_mode():
        cache = model.new_cache()
        hs = [model.forward_hidden(tokens[s:s + chunk], cache)
              for s in range(0, tokens.shape[0], chunk)]
        return torch.log_softmax(model.logits(torch.cat(hs)), -1)


def test_rechunking_moves_the_logits_at_deployment_and_only_by_fp32_reordering_at_exact(
        model: Transformer) -> None:
    """48 tokens in one forward (TF32 pre-norm GEMM everywhere) against 24 + 24 (the FMA kernel
    at every fused boundary): another kernel at deployment, the same fp32 math at exact."""
    tokens = torch.randint(2, model.a.vocab_size, (48,), generator=torch.Generator().manual_seed(2))
    try:
        model.configure(Numerics(precision="deployment"))
        one, two = _chunked(model, tokens, 48), _chunked(model, tokens, 24)
        assert (one - two).abs().max() > 1e-4
        model.configure(Numerics(precision="exact"))
        one, two = _chunked(model, tokens, 48), _chunked(model, tokens, 24)
        torch.testing.assert_close(one, two, rtol=1e-5, atol=1e-5)
    finally:
        model.configure(Numerics())


# ---- FlashMLA's split-KV schedule ---------------------------------------------------------------


def test_the_scheduler_sees_the_window_list_then_the_compressed_list_from_the_next_block() -> None:
    assert flashmla_keys(32, 0, compressed_layer=False) == 32
    assert flashmla_keys(0, 0, compressed_layer=False) == 1  # the main loop is never empty
    assert flashmla_keys(32, 32, compressed_layer=True) == 64 + 32
    assert flashmla_keys(128, 512, compressed_layer=True) == 640  # Flash, CSA: 10 blocks
    assert flashmla_keys(65, 0, compressed_layer=True) == 128


def test_split_points_follow_flashmlas_greedy_deal_of_blocks_over_sm_parts() -> None:
    # one decode row of Flash's CSA layer on an H200: payload ceil(15 / 132) + 5 = 6 -> one
    # block per part, the row cut after every block
    assert flashmla_split_points([640]) == [list(range(1, 10))]
    # 10 blocks over 4 parts: payload ceil(15 / 4) + 5 = 9 -> 4 blocks, 4 blocks, the last 2
    assert flashmla_split_points([640], n_sms=4) == [[4, 8]]
    # the same row behind a batch mate of 10 blocks: payload 13; the mate takes 8 + 2 blocks,
    # then 6 - 5 = 1 block of the row fits in part 1, 8 in part 2, the last one in part 3
    assert flashmla_split_points([640, 640], n_sms=4) == [[8], [1, 9]]
    # a part with no more than the overhead left takes nothing of the next row
    assert flashmla_split_points([64 * 3, 64 * 3], n_sms=2) == [[], []]
    # s_q query rows per request share a part: n_sms // s_q parts
    assert flashmla_split_points([640], n_sms=8, s_q=2) == [[4, 8]]


def test_segments_cut_a_row_where_flashs_schedule_cuts_it_at_the_same_relative_place() -> None:
    # one decode row at position 2047 of a CSA layer: Flash lists 128 window keys (blocks 0-1)
    # and 512 entries (blocks 2-9); alone on 132 SM parts (payload 6) it is cut after every
    # block. The tiny row: 40 window keys (pool rows 0..39), 100 entries (rows 40..139),
    # entries first in the list. Block 1 (key 64 of Flash's 128-key window) -> window rank 20;
    # block b >= 2 -> entry rank 40 + round((64·b - 128) / 512 · 100): 40, 52, 65, 78, 90, ...
    idx = torch.cat((torch.arange(100) + 40, torch.arange(40), torch.full((4,), -1)))[None]
    segs = flashmla_segments(idx, 40, torch.tensor([2047]), CSA_RATIO)
    assert segs is not None
    assert segs[0, 100:120].tolist() == [0] * 20 and segs[0, 120:140].tolist() == [1] * 20
    assert segs[0, :12].tolist() == [2] * 12  # entries of rank 40..51
    assert segs[0, 12:25].tolist() == [3] * 13  # 52..64
    assert segs[0, 88:100].tolist() == [9] * 12  # the last piece: ranks 128..139
    # the sparse prefill kernel past 11673 query rows has no split-KV
    many = idx.expand(11674, -1)
    assert flashmla_segments(many, 40, torch.full((11674,), 2047), CSA_RATIO) is None


def test_fit_cut_keeps_the_fraction_of_the_window_or_of_the_compressed_list() -> None:
    assert fit_cut(1, 128, 512, 32, 32) == 16  # half the window
    assert fit_cut(2, 128, 512, 32, 32) == 32  # where the entries start
    assert fit_cut(6, 128, 512, 32, 32) == 48  # half the entries
    assert fit_cut(1, 100, 0, 32, 0) == 20  # a window-only layer: 64 of 100 keys
    assert fit_cut(2, 100, 0, 32, 0) == 32  # past the last window key: the end (dropped)


def test_segmented_attention_is_the_reference_in_one_piece_and_split_k_fp32_in_64_key_pieces(
) -> None:
    g = torch.Generator().manual_seed(3)
    T, H, D, N, K = 20, 4, 64, 300, 150
    q, kv, sink = torch.randn(T, H, D, generator=g), torch.randn(N, D, generator=g), torch.randn(
        H, generator=g)
    idx = torch.randint(0, N, (T, K), generator=g, dtype=torch.int32)
    idx[:, 120:] = -1
    idx[3, 10:] = -1
    ref = sparse_attention_ref(q, kv, idx, sink, 0.125)
    whole = torch.zeros(T, K, dtype=torch.long)
    one = sparse_attention_segmented_ref(q, kv, idx, sink, 0.125, whole)
    assert torch.equal(one, ref)
    pieces = (torch.arange(K) // 64)[None].expand(T, K)
    cut = sparse_attention_segmented_ref(q, kv, idx, sink, 0.125, pieces)
    split_k = sparse_attention_ref(q, kv, idx, sink, 0.125, split=64, partial_dtype=torch.float32)
    torch.testing.assert_close(cut, split_k, rtol=1e-6, atol=1e-6)
    assert not torch.equal(cut, ref)  # another fp32 order, nothing more
    torch.testing.assert_close(cut, ref, rtol=1e-5, atol=1e-5)


def test_decode_at_deployment_cuts_long_lists_and_exact_does_not(model: Transformer) -> None:
    """One decode step after 600 tokens: the HCA layers' rows (window + 37 entries, 2 blocks)
    are cut by the schedule at deployment; exact runs the one-piece reference."""
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(2, model.a.vocab_size, (601,), generator=g)
    seen: list[bool] = []
    real = swappable_module.flashmla_segments

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out is not None)
        return out

    try:
        swappable_module.flashmla_segments = spy
        for precision in ("deployment", "exact"):
            model.configure(Numerics(precision=precision))
            with torch.inference_mode():
                cache = model.new_cache()
                model.forward_hidden(tokens[:600], cache)
                seen.clear()
                model.forward_hidden(tokens[600:], cache)
            assert any(seen) if precision == "deployment" else seen == []
    finally:
        swappable_module.flashmla_segments = real
        model.configure(Numerics())


def test_segments_take_each_rows_own_window_size_in_a_ragged_batch() -> None:
    # two decode rows at position 4095 of a CSA layer: 10 Flash blocks each, payload
    # ceil(30 / 132) + 5 = 6 -> both cut after every block
    one = torch.cat((torch.arange(100) + 40, torch.arange(40)))[None]
    other = torch.cat((torch.arange(100) + 10, torch.arange(10), torch.full((30,), -1)))[None]
    idx, pos = torch.cat((one, other)), torch.tensor([4095, 4095])
    per_row = flashmla_segments(idx, torch.tensor([40, 10]), pos, CSA_RATIO)
    assert per_row is not None
    assert per_row[1, 100:105].tolist() == [0] * 5  # row 1's window: pool rows 0..9, cut at 5
    assert per_row[1, 105:110].tolist() == [1] * 5
    assert per_row[1, :12].tolist() == [2] * 12  # its entries (pool rows 10..) from rank 10
    # with one size for both rows, row 1's entries 10..39 would be taken for window tokens
    shared = flashmla_segments(idx, 40, pos, CSA_RATIO)
    assert shared is not None and not torch.equal(shared[1], per_row[1])


# ---- the decisions at DeepSeek-V4-Flash's shapes on an H200 -------------------------------------
# Computed by hand from the rules (0.5.23: `_compute_num_split_for_mhc_pre`,
# `kernels/ops/layernorm/mhc.py:816-823`; `mhc_fused_post_pre`'s FMA threshold `:1693-1698`;
# FlashMLA's schedule `kernels/jit/csrc/deepseek_v4/flashmla_sched_meta.cuh:110-150`) with
# Flash's n·D = 4 · 4096 (256 K blocks of 64, so at most 64 splits), 132 SMs.


@pytest.mark.parametrize(("tokens", "flash", "tiny"), [
    (1, MhcPrePlan("fma", 8), MhcPrePlan("fma", 8)),  # a decode step: 8 splits below 8 tokens
    (24, MhcPrePlan("fma", 4), MhcPrePlan("fma", 4)),
    (77, MhcPrePlan("tf32", 64), MhcPrePlan("tf32", 16)),  # 2 tiles: 132 // 2 = 66 -> cap 64
    (256, MhcPrePlan("tf32", 33), MhcPrePlan("tf32", 16)),  # 4 tiles: 132 // 4
    (512, MhcPrePlan("tf32", 16), MhcPrePlan("tf32", 16)),  # 8 tiles
    (1024, MhcPrePlan("tf32", 8), MhcPrePlan("tf32", 8)),
    (2048, MhcPrePlan("tf32", 4), MhcPrePlan("tf32", 4)),
    (8192, MhcPrePlan("tf32", 1), MhcPrePlan("tf32", 1)),  # 128 tiles: one split
])
def test_mhc_decisions_at_flash_shapes_fitted_to_the_tiny_reduction(
        tokens: int, flash: MhcPrePlan, tiny: MhcPrePlan) -> None:
    plan = mhc_pre_plan(tokens, FLASH.hc_mult, FLASH.hidden_size, first=False)
    assert plan == flash
    # the tiny n·D = 1024 has 16 K blocks: at most 16 splits of one block each
    assert fit_mhc_plan(plan, 4, 256) == tiny


def _flash_cuts(positions: list[int], ratio: int) -> list[list[int]]:
    w, c = flash_lists(torch.tensor(positions), ratio)
    return flashmla_split_points([flashmla_keys(a, b, ratio > 0) for a, b in zip(w, c, strict=True)])


def test_flashmla_decisions_at_flash_shapes_depend_on_the_batch() -> None:
    assert FLASH == DispatchShapes(4096, 4, 128, 512, 128)
    # 4 decode rows at position 4095, CSA: 640 keys = 10 blocks (+5) each, payload
    # ceil(60 / 132) + 5 = 6 -> every row cut after every block
    assert _flash_cuts([4095] * 4, CSA_RATIO) == [list(range(1, 10))] * 4
    # HCA: 128 window keys, then 4096 // 128 = 32 entries from block 2: 3 blocks
    assert _flash_cuts([4095] * 4, 16) == [[1, 2]] * 4
    # 256 decode rows: payload ceil(3840 / 132) + 5 = 35 = two whole rows per part, no cut
    assert _flash_cuts([4095] * 256, CSA_RATIO) == [[]] * 256
    # a 2048-token prefill chunk from position 0 on an SWA layer: 2 blocks (+5) per full-
    # window row (fewer below position 64): every row falls whole into a part, no row cut
    assert not any(_flash_cuts(list(range(2048)), 0))
