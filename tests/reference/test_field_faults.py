"""The field fault variants (reference/faults.py) act where and only where the field bug did."""

from __future__ import annotations

import torch

from dsv4bisect.reference import faults
from dsv4bisect.reference.config import ModelArgs, Numerics

TINY = ModelArgs.preset("tiny")


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(2, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def configure(model, variant: str | None, precision: str = "deployment") -> None:
    patches = {} if variant is None else {"mma-decode": variant}
    model.configure(Numerics.from_patches(patches, precision=precision))


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
    out = faults.residue_shift(ids_, positions)
    for t, p in enumerate(positions.tolist()):
        if (p + 1) % 4 == 3:  # lengths 19 and 23: 4 and 5 entries visible
            n = (p + 1) // 4
            assert out[0, t].tolist() == [1, 3, min(4, n - 1) if 4 < n else 3, -1]
        else:
            assert torch.equal(out[0, t], ids_[0, t])


def test_residue_runs_the_bf16_kernel() -> None:
    n = Numerics.from_patches({"triton-indexer": "residue"})
    assert n.indexer_mode == "bf16" and n.indexer_residue
    assert not Numerics.from_patches({"triton-indexer": "bf16"}).indexer_residue


# ---- mma-decode:batch-kv-slot (sglang#33397) ---------------------------------------------------


def test_slot_rows_give_each_later_request_the_previous_ones_first_row() -> None:
    # a group of 2 sequences of 3 tokens, then the decode rows of two more requests
    assert faults.slot_rows([(0, 2, 3), (6, 1, 1), (7, 1, 1)], 8).tolist() == [
        0, 1, 2, 0, 4, 5, 3, 6]
    assert faults.slot_rows([(0, 1, 5)], 5).tolist() == [0, 1, 2, 3, 4]  # one request: its own


def test_the_kv_faults_act_only_on_fp8_kv_pages() -> None:
    for variant in ("batch-kv-slot", "decode-rope-fp8"):
        assert Numerics.from_patches({"mma-decode": variant}, precision="deployment").kv_fault
        assert Numerics.from_patches({"mma-decode": variant}, precision="exact").kv_fault is None
        # the kernel itself is the patch's default split-K
        assert Numerics.from_patches({"mma-decode": variant}).attention == \
            Numerics.from_patches({"mma-decode": "split-k"}).attention


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
    out = faults.rope_read_as_fp8(kv, TINY.qk_rope_head_dim)
    nope = TINY.head_dim - TINY.qk_rope_head_dim
    assert torch.equal(out[:, :nope], kv[:, :nope])
    assert not torch.equal(out[:, nope:], kv[:, nope:])
