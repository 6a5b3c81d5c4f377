"""The scheduler's batching rules (SGLang's: prefill first, FCFS in a token budget, the chunked
request continues first, max_running_requests), cancellation, draining, and the prefix cache,
driven step by step on the random tiny engine (no server)."""

from __future__ import annotations

import threading

import pytest
import torch

from dsv4bisect.reference.cancel import Cancelled
from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.generation import Generator, GenSpec
from dsv4bisect.reference.prefix_cache import PrefixCache
from dsv4bisect.reference.request import Request
from dsv4bisect.reference.scheduler import Scheduler
from dsv4bisect.reference.tokenizer import ByteTokenizer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def engine() -> ReferenceEngine:
    return ReferenceEngine.load(None, precision="exact", device="cpu", chunk_size=2048)


def ids(n: int, seed: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(3, 250, (n,), generator=g).tolist())


def req(prompt: tuple[int, ...], new: int = 3, **kw) -> Request:
    return Request(prompt, new, frozenset(), **kw)


def shape(step) -> tuple[str, list[tuple[int, int]]]:
    """A step as (kind, [(prompt length, tokens run)])."""
    kind, work = step
    return kind, [(len(r.ids), n) for r, n in work]


def drain(sched: Scheduler) -> list:
    steps = []
    while (s := sched.step()) is not None:
        steps.append(s)
    return steps


def test_prefill_budget_fcfs_and_the_chunked_request_first(engine) -> None:
    sched = Scheduler(engine, chunk_size=32, background=False)
    a, b, c = req(ids(20, 1)), req(ids(21, 2)), req(ids(5, 3))
    for r in (a, b, c):
        sched.submit(r)
    assert shape(sched.step()) == ("prefill", [(20, 20), (21, 12)])  # b is split at the budget
    assert shape(sched.step()) == ("prefill", [(21, 9), (5, 5)])  # b continues first, then c
    assert shape(sched.step()) == ("decode", [(20, 1), (21, 1), (5, 1)])  # all three decode
    drain(sched)
    for r in (a, b, c):
        assert r.done.is_set() and r.error is None and r.finish_reason == "length"
        assert r.output_ids == engine.generate(r.ids, max_new_tokens=3, stop_ids=()).output_ids
    assert sched.totals["peak_running_requests"] == 3
    assert sched.totals["prefill_tokens_computed"] == 46


def test_prefill_waits_for_a_free_running_slot(engine) -> None:
    sched = Scheduler(engine, chunk_size=512, max_running_requests=2, background=False)
    a, b, c = req(ids(9, 4), new=2), req(ids(9, 5), new=4), req(ids(9, 6), new=2)
    for r in (a, b, c):
        sched.submit(r)
    assert shape(sched.step()) == ("prefill", [(9, 9), (9, 9)])  # c waits: two are running
    assert shape(sched.step()) == ("decode", [(9, 1), (9, 1)])  # a's second token: a is done
    assert a.done.is_set() and not c.done.is_set()
    assert shape(sched.step()) == ("prefill", [(9, 9)])  # c takes a's slot before decoding
    drain(sched)
    assert all(r.done.is_set() and r.error is None for r in (a, b, c))
    assert sched.totals["peak_running_requests"] == 2


def test_a_cancelled_request_leaves_at_the_next_step(engine) -> None:
    sched = Scheduler(engine, chunk_size=512, background=False)
    a, b = req(ids(12, 7), new=8), req(ids(14, 8), new=8)
    sched.submit(a)
    sched.submit(b)
    sched.step()
    sched.cancel(b)
    assert shape(sched.step()) == ("decode", [(12, 1)])
    assert b.done.is_set() and isinstance(b.error, Cancelled)
    waiting = req(ids(6, 9))
    sched.submit(waiting)
    sched.cancel(waiting)  # cancelled before it ever ran: never admitted
    assert shape(sched.step()) == ("decode", [(12, 1)])
    assert isinstance(waiting.error, Cancelled) and waiting.filled == 0
    drain(sched)
    assert a.error is None and len(a.output_ids) == 8


def test_scoring_is_prefill_work_and_equals_the_engine(engine) -> None:
    prompt = ids(40, 10)
    sched = Scheduler(engine, chunk_size=16, background=False)
    scored = req(prompt, new=0, score_from=5, top_k=2)
    sched.submit(scored)
    steps = drain(sched)
    assert [shape(s) for s in steps] == [("prefill", [(40, 16)]), ("prefill", [(40, 16)]),
                                         ("prefill", [(40, 7)])]  # the last token is not needed
    want = engine.score(prompt, start=5, top_logprobs=2)
    assert [s.position for s in scored.scores] == [s.position for s in want]
    for got, ref in zip(scored.scores, want, strict=True):
        assert got.token_id == ref.token_id and [t for t, _ in got.top] == [t for t, _ in ref.top]
        assert got.logprob == pytest.approx(ref.logprob, abs=1e-5)


def test_a_prefix_hit_prefills_only_the_rest_and_equals_from_scratch(engine) -> None:
    cache = PrefixCache()
    sched = Scheduler(engine, chunk_size=64, prefix_cache=cache, background=False)
    first = req(ids(90, 11), new=6)
    sched.submit(first)
    drain(sched)
    turn2 = first.ids + tuple(first.output_ids) + ids(20, 12)
    second = req(turn2, new=6)
    sched.submit(second)
    steps = drain(sched)
    assert second.cached_tokens == 90 + 5  # the prompt and all but the last output token
    assert shape(steps[0]) == ("prefill", [(len(turn2), len(turn2) - 95)])
    assert second.output_ids == engine.generate(turn2, max_new_tokens=6, stop_ids=()).output_ids
    assert sched.totals["prefix_cache_hit_tokens"] == 95
    # a scored request takes no cached state past its first scored position
    scored = req(turn2, new=1, score_from=50)
    sched.submit(scored)
    drain(sched)
    assert scored.cached_tokens == 0 and len(scored.scores) == len(turn2) - 50
    scored_at_end = req(first.ids + (7,), new=1, score_from=90)  # needs row 89 computed
    plain = req(first.ids + (8,), new=1)  # (+ (7,) would now be a whole hit: 91)
    for r in (scored_at_end, plain):
        sched.submit(r)
        drain(sched)
    assert (scored_at_end.cached_tokens, plain.cached_tokens) == (0, 90)


def test_the_same_prompt_sent_again_resumes_whole_and_answers_as_cold(engine) -> None:
    """A retry (the same prompt, generating) hits the prompt's own snapshot: no token is
    computed, its first token comes from the logits the snapshot kept, and the answer is the
    cold one, bit for bit (exact); a scoring request of the same ids still computes a token."""
    cache = PrefixCache()
    sched = Scheduler(engine, chunk_size=64, prefix_cache=cache, background=False)
    prompt = ids(90, 21)
    cold = req(prompt, new=6)
    sched.submit(cold)
    drain(sched)
    computed = sched.totals["prefill_tokens_computed"]
    retry = req(prompt, new=6, top_k=3)
    sched.submit(retry)
    steps = drain(sched)
    assert retry.cached_tokens == 90 and shape(steps[0]) == ("prefill", [(90, 0)])
    assert sched.totals["prefill_tokens_computed"] == computed  # nothing recomputed
    assert (retry.output_ids, retry.logprobs) == (cold.output_ids, cold.logprobs)
    assert retry.output_ids == engine.generate(prompt, max_new_tokens=6, stop_ids=()).output_ids
    # a one-token prime and the retry beside another request in one batch: still whole hits
    prime, other = req(prompt, new=1), req(ids(30, 22), new=2)
    for r in (prime, other):
        sched.submit(r)
    assert shape(sched.step()) == ("prefill", [(90, 0), (30, 30)])
    drain(sched)
    assert prime.output_ids == cold.output_ids[:1] and prime.cached_tokens == 90
    # scoring needs the last rows computed: no whole hit, the snapshot is not used
    scored = req(prompt, new=0, score_from=80)
    sched.submit(scored)
    drain(sched)
    assert scored.cached_tokens == 0


def test_prefix_cache_matches_only_where_a_snapshot_was_taken(engine) -> None:
    model = engine.model
    pc = PrefixCache()
    state = model.new_cache()
    with torch.inference_mode():
        model.forward_hidden(torch.tensor(ids(30, 13)), state)
    pc.insert(ids(30, 13), state)
    assert pc.match(ids(30, 13) + (5, 6), limit=31).tokens == 30
    assert pc.match(ids(30, 13) + (5,), limit=29).tokens == 0  # the snapshot is longer
    other = ids(20, 13) + ids(15, 14)  # shares 20 tokens: the split node has no state
    assert pc.match(other, limit=34).tokens == 0
    hit = pc.match(ids(30, 13) + (5, 6), limit=31)
    assert hit.cache is not None and hit.cache.n_tokens == 30 and hit.cache is not state


def test_prefix_cache_evicts_the_least_recently_used_beyond_its_budget(engine) -> None:
    model = engine.model
    states = []
    for seed in (15, 16, 17):
        s = model.new_cache()
        with torch.inference_mode():
            model.forward_hidden(torch.tensor(ids(40, seed)), s)
        states.append(s)
    pc = PrefixCache(budget_bytes=2 * states[0].nbytes + 1)
    pc.insert(ids(40, 15), states[0])
    pc.insert(ids(40, 16), states[1])
    assert pc.match(ids(40, 15) + (1,), limit=40).tokens == 40  # 15 is now the most recent
    pc.insert(ids(40, 17), states[2])  # over budget: 16 goes
    assert len(pc) == 2 and pc.nbytes <= pc.budget
    assert pc.match(ids(40, 16) + (1,), limit=40).tokens == 0
    assert pc.match(ids(40, 15) + (1,), limit=40).tokens == 40
    pc.flush()
    assert len(pc) == 0 and pc.match(ids(40, 15) + (1,), limit=40).tokens == 0


def test_a_forked_cache_is_copy_on_write(engine) -> None:
    model = engine.model
    prompt = torch.tensor(ids(60, 18))
    base = model.new_cache()
    with torch.inference_mode():
        model.forward_hidden(prompt[:40], base)
        fork = base.fork()
        model.forward_hidden(prompt[40:], base)  # appends entries to the original only
        again = model.new_cache()
        model.forward_hidden(prompt[:40], again)
    for got, want in zip(fork.layers, again.layers, strict=True):
        assert fork.n_tokens == 40
        torch.testing.assert_close(got.window, want.window, rtol=0, atol=0)
        for s, w in ((got.comp, want.comp), (got.index, want.index)):
            if s is not None:
                torch.testing.assert_close(s.entries.view(), w.entries.view(), rtol=0, atol=0)


def test_drained_holds_new_requests_and_flushes_the_cache(engine) -> None:
    gen = Generator(engine, ByteTokenizer(engine.config.vocab_size))
    try:
        gen.run(GenSpec(ids(30, 19), 2))
        assert len(gen.prefix_cache) > 0
        results: list[object] = []
        late = threading.Thread(target=lambda: results.append(gen.run(GenSpec(ids(8, 20), 2))))
        with gen.drained():
            assert len(gen.prefix_cache) == 0
            late.start()
            late.join(timeout=1.0)
            assert late.is_alive() and not results  # held while drained
            assert gen.stats()["running_requests"] == 0
        late.join(timeout=60)
        assert len(results) == 1
    finally:
        gen.scheduler.stop()
