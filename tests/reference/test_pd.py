"""PD disaggregation of the embedded engine, in one process: the state a transfer moves, the
decode server's state pool, both backends over real sockets, the two roles around their
schedulers, and the transfer path's field faults (reference/pd/)."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.generation import FAKE_BOOTSTRAP, Bootstrap, Generator, GenSpec
from dsv4bisect.reference.pd.roles import DecodeRole, PrefillRole
from dsv4bisect.reference.pd.slots import StatePool, decode_pool_size, layout
from dsv4bisect.reference.pd.state import KV, STATE, Header, export, restore
from dsv4bisect.reference.pd.transfer import BootstrapServer, TransferFailed, receive
from dsv4bisect.reference.pd.wire import tensor_bytes, tensor_from
from dsv4bisect.reference.request_body import ApiError
from dsv4bisect.reference.spec_settings import SpecSettings
from dsv4bisect.reference.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def engine() -> ReferenceEngine:
    return ReferenceEngine.load(None, precision="exact", device="cpu", mtp=True)


def _prompt(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(1000 * seed + n)
    return (1, *torch.randint(5, 500, (n - 1,), generator=g).tolist())


class _Pair:
    """A prefill and a decode role on one engine (two schedulers), and a plain server."""

    def __init__(self, engine: ReferenceEngine, backend: str, fault: str | None = None, *,
                 max_running: int | None = None, spec: SpecSettings | None = None) -> None:
        tok = ByteTokenizer(engine.config.vocab_size)
        self.plain = Generator(engine, tok, chunk_size=24, spec=spec)
        self.prefill = PrefillRole(Generator(engine, tok, chunk_size=24, spec=spec), backend,
                                   fault, "127.0.0.1", 0)
        self.decode = DecodeRole(Generator(engine, tok, radix_cache=False, spec=spec,
                                           max_running_requests=max_running), backend, fault)
        self.rooms = 0

    def run(self, spec: GenSpec) -> tuple[list[int], list[int]]:
        """(the plain server's output ids, the PD pair's)."""
        self.rooms += 1
        pd = dataclasses.replace(spec, bootstrap=Bootstrap("127.0.0.1",
                                                           self.prefill.bootstrap.port,
                                                           self.rooms))
        got: dict[str, object] = {}
        leg = threading.Thread(target=lambda: got.setdefault("p", self.prefill.run(pd)))
        leg.start()
        out = self.decode.run(pd)
        leg.join()
        return self.plain.run(spec).output_ids, out.output_ids

    def close(self) -> None:
        self.prefill.close()


def _spec(n: int, seed: int = 0, new: int = 6) -> GenSpec:
    return GenSpec(_prompt(n, seed), new, ignore_eos=True)


# ---- the state and the pool -------------------------------------------------------------------


def test_a_transferred_state_is_restored_bit_for_bit(engine) -> None:
    model = engine.model
    cache = model.new_cache(mtp=True)
    ids = torch.tensor(_prompt(75))
    with torch.inference_mode():
        h = model.forward_hidden(ids, cache)
        from dsv4bisect.reference.mtp import feed_mtp

        feed_mtp(model, [(h, ids, cache.mtp)])
    payload = export(cache, Header(75, cache.mtp.rows, 7))
    over_wire = {c: {n: tensor_from(tensor_bytes(t), list(t.shape)) for n, t in bufs.items()}
                 for c, bufs in payload.buffers.items()}
    got = restore(model, payload.header, over_wire["kv"], over_wire["state"], over_wire["aux"])
    for mine, theirs in zip(cache.layers, got.layers, strict=True):
        assert torch.equal(mine.window, theirs.window)
        assert mine.window_start == theirs.window_start
        for a, b in ((mine.comp, theirs.comp), (mine.index, theirs.index)):
            if a is not None:
                assert torch.equal(a.entries.view(), b.entries.view())
                assert torch.equal(a.pending_kv, b.pending_kv)
                assert (a.prev_kv is None) == (b.prev_kv is None)
    assert torch.equal(cache.mtp.h, got.mtp.h) and cache.mtp.rows == got.mtp.rows
    nxt = torch.tensor([42])
    with torch.inference_mode():
        a = model.logits(model.forward_hidden(nxt, cache))
        b = model.logits(model.forward_hidden(nxt, got))
    assert torch.equal(a, b)


def test_the_decode_pool_is_sized_and_handed_out_as_sglangs() -> None:
    # size + pre-allocation: twice the size at <= 32 running requests, none above
    assert [decode_pool_size(n) for n in (2, 32, 33, 256)] == [6, 96, 33, 256]
    pool = StatePool(3, {}, torch.device("cpu"))
    assert [pool.alloc() for _ in range(3)] == [1, 2, 3]
    pool.release(2, None)
    pool.release(1, None)
    assert [pool.alloc(), pool.alloc()] == [2, 1]  # a freed slot goes to the end of the list
    assert pool.reused(2) and not pool.reused(3)


def test_a_slot_holds_what_its_last_occupant_left(engine) -> None:
    model = engine.model
    pool = StatePool(2, layout(model, mtp=False), torch.device("cpu"))
    caches = []
    for seed in (1, 2):
        cache = model.new_cache()
        with torch.inference_mode():
            model.forward_hidden(torch.tensor(_prompt(50, seed)), cache)
        caches.append(cache)
    header = Header(50)
    state = export(caches[0], header).buffers[STATE]
    slot = pool.alloc()
    fresh = pool.read(slot, header)
    assert all(not t.any() for t in fresh.values())  # a slot never used: zeros
    pool.write(slot, header, state)
    assert all(torch.equal(pool.read(slot, header)[n], t) for n, t in state.items())
    pool.release(slot, caches[1])  # its final state stays in the slot
    again = pool.read(slot, header)
    other = export(caches[1], header).buffers[STATE]
    assert all(torch.equal(again[n], t) for n, t in other.items())


# ---- the transfer -----------------------------------------------------------------------------


def test_a_backend_mismatch_and_a_failed_prefill_reach_the_decode_server(engine) -> None:
    server = BootstrapServer("127.0.0.1", 0, "mooncake", None)
    try:
        with pytest.raises(TransferFailed, match="same --disaggregation-transfer-backend"):
            receive(Bootstrap("127.0.0.1", server.port, 1), "nixl", lambda: False)
        server.fail(2, "the prefill failed: boom")
        with pytest.raises(TransferFailed, match="boom"):
            receive(Bootstrap("127.0.0.1", server.port, 2), "mooncake", lambda: False)
    finally:
        server.close()


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_the_pd_pair_answers_as_one_server(engine, backend) -> None:
    pair = _Pair(engine, backend)
    try:
        for n, seed in ((40, 1), (75, 2), (75, 2)):  # chunked at 24; the last a prefix-cache hit
            plain, pd = pair.run(_spec(n, seed))
            assert pd == plain
        prefill = pair.prefill.stats()
        assert prefill["prefix_cache_hit_tokens"] > 0  # the prefill role kept its radix cache
        sent = prefill["pd_transfer_bytes"]
        got = pair.decode.stats()["pd_transfer_bytes"]
        assert sent[KV] == got[KV] > 0 and sent[STATE] == got[STATE] > 0
        assert pair.decode.stats()["pd_transfer_requests"] == 3
    finally:
        pair.close()


def test_speculation_decodes_on_the_decode_role_from_the_transferred_mtp_state(engine) -> None:
    pair = _Pair(engine, "nixl", spec=SpecSettings.resolve("NEXTN"))
    try:
        for seed in (3, 4):
            plain, pd = pair.run(_spec(60, seed, new=16))
            assert pd == plain
        stats = pair.decode.stats()
        assert stats["spec_proposed_drafts"] > 0  # the decode role drafted and verified
        assert stats["pd_transfer_last"]["bytes"]["aux"] > 0  # the MTP layer's streams came
    finally:
        pair.close()


def test_state_not_sent_is_a_fault_of_the_mooncake_backend_only(engine) -> None:
    for backend, broken in (("nixl", False), ("mooncake", True)):
        pair = _Pair(engine, backend, "state-not-sent")
        try:
            outputs = [pair.run(_spec(n, seed)) for n, seed in ((44, 5), (63, 6))]
            last = pair.decode.stats()["pd_transfer_last"]
            assert (last["bytes"][STATE] == 0) is broken and last["bytes"][KV] > 0
            assert any(plain != pd for plain, pd in outputs) is broken
        finally:
            pair.close()


def test_a_stale_slot_starts_once_every_slot_of_the_pool_was_used(engine) -> None:
    pair = _Pair(engine, "mooncake", "stale-slot", max_running=2)
    size = decode_pool_size(2)
    assert pair.decode.pool.size == size == 6
    try:
        outputs = [pair.run(_spec(30 + 3 * k, 10 + k, new=4)) for k in range(size + 2)]
        assert all(plain == pd for plain, pd in outputs[:size])  # every slot new: exact
        assert all(plain != pd for plain, pd in outputs[size:])  # slots 1, 2 again: stale
        assert pair.decode.stats()["pd_transfer_last"]["slot_reused"]
    finally:
        pair.close()


def test_a_pd_role_refuses_a_request_without_bootstrap_and_checks_its_own_health(
        engine) -> None:
    pair = _Pair(engine, "nixl")
    try:
        for role in (pair.prefill, pair.decode):
            with pytest.raises(ApiError, match="through the router"):
                role.run(_spec(20))
            out = role.run(GenSpec((1,), 1, bootstrap=FAKE_BOOTSTRAP))  # /health_generate
            assert len(out.output_ids) == 1
    finally:
        pair.close()
