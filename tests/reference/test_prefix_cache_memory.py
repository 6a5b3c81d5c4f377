"""What the prefix cache counts is what it keeps allocated (issue 40, item 2): every storage
a snapshot references, whole and once, and nothing left behind after a flush or an eviction.

On the random tiny engine (exact precision, no server), with speculative decoding on so the MTP
state is in the snapshots too. The RSS of a real server under a small budget is
`test_server_memory.py` (slow).
"""

from __future__ import annotations

import weakref

import pytest
import torch

from dsv4bisect.reference.cache import LayerCache, ModelCache, held_storages
from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.prefix_cache import PrefixCache
from dsv4bisect.reference.scheduler import Request, Scheduler
from dsv4bisect.reference.spec_settings import SpecSettings

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def engine() -> ReferenceEngine:
    return ReferenceEngine.load(None, precision="exact", device="cpu", mtp=True)


def prompt(n: int, seed: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(3, 250, (n,), generator=g).tolist())


def serve(engine: ReferenceEngine, cache: PrefixCache, prompts: list[tuple[int, ...]],
          new: int = 3) -> None:
    """The prompts in one batch (chunked at 64 tokens), each decoding `new` tokens with MTP."""
    sched = Scheduler(engine, chunk_size=64, background=False, prefix_cache=cache,
                      spec=SpecSettings.resolve("NEXTN"))
    reqs = [Request(p, new, frozenset()) for p in prompts]
    for r in reqs:
        sched.submit(r)
    while sched.step() is not None:
        pass
    assert all(r.error is None for r in reqs)


def kept_tensors(cache: PrefixCache) -> list[torch.Tensor]:
    out = []
    for node in cache._snapshots:
        out += [*node.snapshot.tensors(), *([] if node.logits is None else [node.logits])]
    return out


def test_a_state_counts_the_whole_storage_its_tensors_keep() -> None:
    activations = torch.zeros(1000, 64)  # a forward's rows
    viewed = ModelCache([LayerCache(activations[-31:])], n_tokens=1000)
    owned = ModelCache([LayerCache(activations[-31:].clone())], n_tokens=1000)
    assert viewed.nbytes == 1000 * 64 * 4  # the view keeps all 1000 rows allocated
    assert owned.nbytes == 31 * 64 * 4
    shared = ModelCache([LayerCache(activations[:10]), LayerCache(activations[10:20])])
    assert shared.nbytes == 1000 * 64 * 4  # one storage, counted once


def test_a_snapshot_keeps_no_view_of_a_batchs_activations(engine) -> None:
    """Pending compressor rows, the window and the MTP streams are copies: a snapshot of a
    300-token prompt prefilled beside another must not hold either prompt's projections."""
    cache = PrefixCache()
    serve(engine, cache, [prompt(300, 1), prompt(257, 2)])
    snapshots = [node.snapshot for node in cache._snapshots]
    assert len(snapshots) == 4  # each prompt's end and each output's
    for snap in snapshots:
        for layer in [*snap.layers, snap.mtp.layer]:
            states = [s for s in (layer.comp, layer.index) if s is not None]
            own = [layer.window, *(t for s in states for t in
                                   (s.pending_kv, s.pending_score, s.prev_kv, s.prev_score)
                                   if t is not None)]
            for t in own:
                assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
        h = snap.mtp.h
        assert h.untyped_storage().nbytes() == h.numel() * h.element_size()


def test_the_cache_counts_each_kept_storage_once_and_frees_them_all(engine) -> None:
    cache = PrefixCache()
    serve(engine, cache, [prompt(200, 3), prompt(120, 4)], new=2)
    serve(engine, cache, [prompt(200, 3) + (7, 8, 9)], new=2)  # resumes a snapshot, shares rows
    kept = kept_tensors(cache)
    assert cache.nbytes == sum(held_storages(kept).values()) > 0
    assert sum(t.untyped_storage().nbytes() for t in kept) > cache.nbytes  # some are shared
    gone = [weakref.ref(t) for t in kept]
    del kept
    cache.flush()
    assert cache.nbytes == 0 and len(cache) == 0
    # referenced nowhere else: freed at once, not at the next garbage collection
    assert all(ref() is None for ref in gone)


def test_eviction_keeps_the_real_bytes_within_the_budget_and_frees_the_dropped(engine) -> None:
    probe = PrefixCache()
    serve(engine, probe, [prompt(150, 5)], new=1)
    one = probe.nbytes  # a 150-token prompt's snapshot (a one-token output adds none)
    cache = PrefixCache(3 * one + one // 2)
    serve(engine, cache, [prompt(150, 6)], new=1)
    first = [weakref.ref(t) for t in kept_tensors(cache)]
    for seed in range(7, 12):
        serve(engine, cache, [prompt(150, seed)], new=1)
        kept = kept_tensors(cache)
        assert cache.nbytes == sum(held_storages(kept).values()) <= cache.budget
        del kept
    assert len(cache) == 3
    assert all(ref() is None for ref in first)  # the least recently used went, and is freed
