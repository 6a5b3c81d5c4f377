"""Speculative decoding's parts: SGLang's argument resolution, the verification rule (greedy and
rejection sampling), the cache commit of a prefix of a verify forward's rows, and the scheduler's
speculative decode step against plain greedy decoding on the random tiny engine (its MTP layer is
random, so most drafts are rejected: every rollback path runs)."""

from __future__ import annotations

import pytest
import torch

from dsv4bisect.errors import ConfigError
from dsv4bisect.reference.checkpoint import random_model
from dsv4bisect.reference.config import ModelArgs, Numerics
from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.prefix_cache import PrefixCache
from dsv4bisect.reference.request import Request
from dsv4bisect.reference.sampling import Sampling
from dsv4bisect.reference.scheduler import Scheduler
from dsv4bisect.reference.spec_settings import SpecSettings
from dsv4bisect.reference.speculative import commit_rows, spec_metrics, verify

pytestmark = pytest.mark.timeout(300)


# ---- settings -----------------------------------------------------------------------------------


def test_the_algorithm_alone_is_sglangs_deepseek_default_and_steps_set_the_draft_tokens() -> None:
    assert SpecSettings.resolve("NEXTN") == SpecSettings("NEXTN", 3, 1, 4)
    assert SpecSettings.resolve("nextn", 2) == SpecSettings("NEXTN", 2, 1, 3)
    assert SpecSettings.resolve("NEXTN", 3, 1, 7) == SpecSettings("NEXTN", 3, 1, 4)  # as SGLang
    assert SpecSettings.resolve(None) is None
    assert SpecSettings.resolve("NEXTN").server_args()["speculative_num_draft_tokens"] == 4


@pytest.mark.parametrize(("args", "words"), [
    (("NEXTN", 3, 2, None), "tree verification"),
    (("NEXTN", None, 2, None), "tree verification"),
    (("NEXTN", None, None, 4), "need --speculative-num-steps"),
    ((None, 3, None, None), "without --speculative-algorithm"),
    (("MEDUSA",), "unknown"),
    (("NEXTN", 0), "positive integer"),
])
def test_settings_sglang_would_not_run_are_refused_with_a_hint(args, words) -> None:
    with pytest.raises(ConfigError, match=words) as e:
        SpecSettings.resolve(*args)
    assert e.value.hint


# ---- verification -------------------------------------------------------------------------------


def test_greedy_verification_keeps_the_matching_prefix_and_the_main_models_next_token() -> None:
    main = [5, 6, 9, 4]  # the main model's argmax at verify rows 0..3
    assert verify([5, 6, 7], main.__getitem__).tokens == [5, 6, 9]
    assert verify([5, 6, 7], main.__getitem__).accepted == 2
    assert verify([1, 6, 9], main.__getitem__).tokens == [5]
    full = verify([5, 6, 9], main.__getitem__)
    assert (full.tokens, full.accepted) == ([5, 6, 9, 4], 3)
    assert verify([], main.__getitem__).tokens == [5]


def test_rejection_sampling_emits_the_main_models_distribution() -> None:
    """A point-mass draft accepted with p(draft), else a token from p without it: the first
    token is distributed as p, whatever the draft (20 000 seeded rounds, within 0.015)."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]])
    g = torch.Generator().manual_seed(0)
    for draft in (0, 2, 3):
        counts = torch.zeros(4)
        for _ in range(20_000):
            v = verify([draft], lambda i: int(torch.multinomial(p[i], 1, generator=g)), p, g)
            counts[v.tokens[0]] += 1
        assert torch.allclose(counts / counts.sum(), p[0], atol=0.015), (draft, counts)


def test_metrics_are_sglangs_ratios() -> None:
    totals = {"spec_accepted_drafts": 6, "spec_proposed_drafts": 9, "spec_emitted_tokens": 9,
              "spec_verify_forwards": 3, "main_forwards": 4, "output_tokens": 10}
    assert spec_metrics(totals) == {"spec_accept_rate": 0.6667, "avg_spec_accept_length": 3.0,
                                    "main_forwards_per_output_token": 0.4}
    assert spec_metrics({})["spec_accept_rate"] is None


# ---- the cache commit ---------------------------------------------------------------------------


def _same_cache(a, b) -> None:
    assert a.n_tokens == b.n_tokens
    for x, y in zip(a.layers, b.layers, strict=True):
        assert x.window_start == y.window_start
        torch.testing.assert_close(x.window, y.window, rtol=1e-5, atol=1e-5)
        for s, t in ((x.comp, y.comp), (x.index, y.index)):
            if s is None:
                continue
            assert s.n_entries == t.n_entries
            torch.testing.assert_close(s.entries.view(), t.entries.view(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(s.pending_kv, t.pending_kv, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(s.pending_score, t.pending_score, rtol=1e-5, atol=1e-5)
            assert (s.prev_kv is None) == (t.prev_kv is None)
            if s.prev_kv is not None:
                torch.testing.assert_close(s.prev_kv, t.prev_kv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["exact", "deployment"])
@pytest.mark.parametrize(("prompt", "kept"), [(30, 2), (31, 1), (46, 3), (14, 4)])
def test_committing_a_prefix_of_a_verify_forward_equals_running_only_it(precision, prompt,
                                                                         kept) -> None:
    """Prompts that put a ratio-4 and a ratio-16 window boundary inside the kept rows or the
    rejected ones (and a window of 16 rows that the verify rows push old rows out of)."""
    model = random_model(ModelArgs.preset("tiny"), 0)
    model.configure(Numerics(precision=precision))
    g = torch.Generator().manual_seed(prompt)
    ids = torch.randint(3, 250, (prompt + 5,), generator=g)
    with torch.inference_mode():
        committed, plain = model.new_cache(), model.new_cache()
        model.forward_hidden(ids[:prompt], committed)
        model.forward_hidden(ids[:prompt], plain)
        fork, trace = committed.fork(), {}
        model.forward_ragged([(ids[prompt : prompt + 4], fork)], [trace])
        commit_rows(model, committed, trace, kept)
        model.forward_hidden(ids[prompt : prompt + kept], plain)
        _same_cache(committed, plain)
        nxt = ids[prompt + kept : prompt + kept + 1]
        torch.testing.assert_close(model.logits(model.forward_hidden(nxt, committed)),
                                   model.logits(model.forward_hidden(nxt, plain)),
                                   rtol=1e-5, atol=1e-5)


# ---- the scheduler ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> ReferenceEngine:
    return ReferenceEngine.load(None, precision="exact", device="cpu", mtp=True)


def _run(engine, prompts, new, spec, prefix_cache=None, stop=frozenset()):
    sched = Scheduler(engine, chunk_size=24, background=False, spec=spec,
                      prefix_cache=prefix_cache)
    reqs = [Request(p, new, stop) for p in prompts]
    for r in reqs:
        sched.submit(r)
    while sched.step() is not None:
        pass
    assert all(r.error is None for r in reqs)
    return reqs, sched.stats()


def _prompts(*lengths):
    return [tuple(torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(n))
                  .tolist()) for n in lengths]


def test_speculative_greedy_decoding_equals_plain_greedy_decoding(engine) -> None:
    prompts = _prompts(9, 30, 47)  # chunked (budget 24) and batched together
    plain, _ = _run(engine, prompts, 21, None)
    spec, stats = _run(engine, prompts, 21, SpecSettings.resolve("NEXTN"))
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
    for a, b in zip(spec, plain, strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                   rtol=1e-4, atol=1e-4)
    assert stats["spec_proposed_drafts"] > 0 and stats["output_tokens"] == 63
    assert stats["main_forwards"] == 3 + stats["spec_verify_forwards"]


def test_a_stop_id_inside_the_accepted_tokens_ends_the_request_there(engine) -> None:
    prompt = _prompts(20)
    plain, _ = _run(engine, prompt, 30, None)
    stop = frozenset({plain[0].output_ids[5]})
    want, _ = _run(engine, prompt, 30, None, stop=stop)
    got, _ = _run(engine, prompt, 30, SpecSettings.resolve("NEXTN"), stop=stop)
    assert got[0].output_ids == want[0].output_ids and got[0].finish_reason == "stop"


def test_a_prefix_cache_hit_resumes_the_mtp_state_too(engine) -> None:
    """The second request continues the first's snapshot (prompt + output): the same tokens as
    from scratch."""
    spec = SpecSettings.resolve("NEXTN")
    (first,), _ = _run(engine, _prompts(26), 12, spec)
    follow = first.ids + tuple(first.output_ids) + (17, 18, 19)
    cache = PrefixCache()
    _run(engine, [first.ids], 12, spec, prefix_cache=cache)
    (hit,), stats = _run(engine, [follow], 10, spec, prefix_cache=cache)
    (scratch,), _ = _run(engine, [follow], 10, None)
    assert stats["prefix_cache_hit_tokens"] > 0
    assert hit.output_ids == scratch.output_ids


# ---- sampling -----------------------------------------------------------------------------------


def test_sampling_distribution_is_temperature_then_top_k_then_top_p() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    assert torch.allclose(Sampling(1.0).probs(logits), torch.tensor([0.4, 0.3, 0.2, 0.1]))
    assert torch.allclose(Sampling(1.0, top_k=2).probs(logits), torch.tensor([4, 3, 0, 0]) / 7)
    # top-p 0.6: 0.4 does not reach it, 0.4 + 0.3 does: the crossing token stays
    assert torch.allclose(Sampling(1.0, top_p=0.6).probs(logits), torch.tensor([4, 3, 0, 0]) / 7)
    cold = Sampling(0.5).probs(logits)
    assert torch.allclose(cold, torch.tensor([16, 9, 4, 1]) / 30)
    assert Sampling(0.0).greedy and Sampling(0.7, top_k=1).greedy and not Sampling(0.7).greedy


def test_a_seeded_sampled_request_draws_the_same_tokens_alone_and_in_a_batch(engine) -> None:
    hot = Sampling(1.0, top_p=0.9, seed=7)
    prompts = _prompts(12, 33)
    alone = Request(prompts[0], 16, frozenset(), sampling=hot)
    batch = [Request(prompts[0], 16, frozenset(), sampling=hot),
             Request(prompts[1], 16, frozenset(), sampling=Sampling(1.0, seed=1))]
    for reqs in ([alone], batch):
        sched = Scheduler(engine, background=False)
        for r in reqs:
            sched.submit(r)
        while sched.step() is not None:
            pass
    assert alone.output_ids == batch[0].output_ids
    greedy = _run(engine, prompts[:1], 16, None)[0][0].output_ids
    assert alone.output_ids != greedy  # it did sample


def test_speculative_sampling_runs_and_counts_its_rounds(engine) -> None:
    sched = Scheduler(engine, background=False, spec=SpecSettings.resolve("NEXTN"))
    reqs = [Request(p, 20, frozenset(), sampling=Sampling(0.8, top_k=20, seed=s))
            for s, p in enumerate(_prompts(15, 28))]
    for r in reqs:
        sched.submit(r)
    while sched.step() is not None:
        pass
    assert [len(r.output_ids) for r in reqs] == [20, 20] and all(r.error is None for r in reqs)
    stats = sched.stats()
    assert stats["spec_verify_forwards"] > 0 and stats["output_tokens"] == 40


# ---- the patch ----------------------------------------------------------------------------------


def test_the_patch_turns_speculation_on_with_its_fault_and_is_never_switched_hot(tmp_path) -> None:
    from types import SimpleNamespace

    from dsv4bisect.reference.serving import ServeOptions, speculation
    from dsv4bisect.reference.switch import HotSwitch

    assert speculation(ServeOptions()) is None
    for variant in ("nextn", "draft-eos", "greedy-verify"):  # SGLang's NEXTN default
        assert speculation(ServeOptions(patches={"nextn-speculation": variant})) == SpecSettings()
    two = SpecSettings.resolve("NEXTN", 2)
    assert speculation(ServeOptions(speculative=two)) == two
    assert speculation(ServeOptions(speculative=two,
                                    patches={"nextn-speculation": "nextn"})) == two
    engine = SimpleNamespace(numerics=SimpleNamespace(patches={}))
    hot = HotSwitch(engine, None, {}, tmp_path, {"nextn-speculation": "nextn"}, "server")
    assert "nextn-speculation cannot change in a running engine" in hot.refusal(
        {"nextn-speculation": "nextn"})


def test_draft_eos_ends_the_request_at_a_drafted_stop_id_the_main_model_did_not_pick() -> None:
    from dsv4bisect.patches.nextn_speculation import stop_at_drafted_stop
    from dsv4bisect.reference.speculative import Verdict

    eos = frozenset({1})
    right = Verdict([5, 6, 9], 2)  # drafts 5, 6 accepted, 9 the main model's own token
    assert stop_at_drafted_stop(right, [5, 6, 7], eos) == right  # no stop id drafted
    assert stop_at_drafted_stop(right, [5, 6, 1], eos).tokens == [5, 6, 1]  # false EOS
    assert stop_at_drafted_stop(Verdict([5, 1], 1), [5, 1, 3], eos).tokens == [5, 1]  # verified


def test_a_scheduler_with_the_draft_eos_fault_truncates_where_the_mtp_layer_drafts_a_stop(
        engine) -> None:
    """On the random model the MTP layer drafts arbitrary ids: with a drafted id made a stop id,
    the faulty verification ends requests early that plain decoding runs to their length."""
    spec = SpecSettings.resolve("NEXTN")
    prompts = _prompts(10, 22, 35)
    stops = frozenset(range(3, 250, 2))  # half the vocabulary: some drafted, few chosen
    want, _ = _run(engine, prompts, 24, None, stop=stops)
    faulty = ReferenceEngine.load(None, patches={"nextn-speculation": "draft-eos"},
                                  precision="exact", device="cpu", mtp=True)
    assert faulty.model.spec_verify is not engine.model.spec_verify
    sched = Scheduler(faulty, background=False, spec=spec)
    reqs = [Request(p, 24, stops) for p in prompts]
    for r in reqs:
        sched.submit(r)
    while sched.step() is not None:
        pass
    assert [len(r.output_ids) for r in reqs] != [len(r.output_ids) for r in want]
    for got, plain in zip(reqs, want, strict=True):  # a prefix of the right answer, then a stop
        assert got.output_ids[:-1] == plain.output_ids[: len(got.output_ids) - 1]
        assert got.output_ids[-1] in stops
