"""The pure search: correctness against oracles, determinism, skips, budgets, validation."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simulated import simulate  # tests/bisect/simulated.py

from dsv4bisect.bisect.plan.simulate import oracle_outcome
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.hypotheses import Priors, tier_weights
from dsv4bisect.bisect.search.search import Search, Status
from dsv4bisect.errors import BisectError
from dsv4bisect.probe import verdict as V


def names(n: int) -> list[str]:
    return [f"p{i:02d}" for i in range(n)]


def run_noiseless(search: Search, culprits: frozenset[str]) -> list[frozenset[str]]:
    tested = []
    while proposals := search.next():
        for subset in proposals:
            tested.append(subset)
            search.record(subset, V.FAIL if culprits <= subset else V.PASS)
    return tested


@st.composite
def culprit_cases(draw: st.DrawFn) -> tuple[int, frozenset[str]]:
    n = draw(st.integers(min_value=2, max_value=12))
    size = draw(st.integers(min_value=1, max_value=2))
    members = draw(st.lists(st.integers(0, n - 1), min_size=size, max_size=size, unique=True))
    return n, frozenset(names(n)[i] for i in members)


@settings(max_examples=60, deadline=None)
@given(culprit_cases())
def test_noiseless_finds_the_culprit_set_and_it_is_1_minimal(case: tuple[int, frozenset[str]]):
    n, culprits = case
    search = Search(names(n), noise=Noise())
    tested = run_noiseless(search, culprits)
    result = search.result()
    assert result.status is Status.FOUND
    assert result.culprits == culprits
    assert result.posterior >= 0.95
    fails = {s for s in tested if culprits <= s}
    assert any(culprits <= s for s in fails)  # the set was seen failing
    minimality = [c for c in result.checks if c.member is not None]
    assert {c.member for c in minimality} == culprits
    for check in result.checks:  # each member removed passes (1-minimal); the set fails
        truly_fails = culprits <= check.config
        assert check.confirmed and truly_fails == (check.expect == V.FAIL)
    # within twice the information bound over all culprit sets of size <= 2, plus the ends
    bound = math.ceil(math.log2(n + math.comb(n, 2)))
    assert result.trials_used - 2 <= 2 * bound + 2


def test_a_pair_is_not_reported_as_its_single_on_the_strength_of_the_prior():
    # n = 64: a single's prior is 31 times a pair's, enough to reach 0.95 with the pair still
    # untested; the sufficiency check makes the search run the single alone.
    culprits = frozenset({"p32", "p33"})
    search = Search(names(64), noise=Noise())
    run_noiseless(search, culprits)
    assert search.result().culprits == culprits


def test_both_ends_come_first():
    search = Search(names(8), noise=Noise())
    assert search.next() == [frozenset()]
    search.record(frozenset(), V.PASS)
    assert search.next() == [frozenset(names(8))]
    parallel = Search(names(8), noise=Noise(), parallel=3)
    assert parallel.next()[:2] == [frozenset(), frozenset(names(8))]


def test_noiseless_single_culprits_reduce_to_binary_splitting():
    n = 16
    for culprit in names(n):
        search = Search(names(n), noise=Noise(), max_order=1)
        live = set(names(n))  # the single culprits still consistent with the outcomes
        halvings = extra = 0
        while proposals := search.next():
            phase = search.phase
            for subset in proposals:
                fails = culprit in subset
                if phase == "search":
                    assert len(subset & live) == len(live) // 2  # every test halves them
                    halvings += 1
                elif phase == "confirm":
                    extra += 1
                live = (live & subset) if fails else (live - subset)
                search.record(subset, V.FAIL if fails else V.PASS)
        assert search.result().culprits == {culprit}
        assert halvings == 4 and extra <= 1  # log2(16), then "does it fail alone?" at most


def test_good_end_failing_stops_and_says_so():
    search = Search(names(6), noise=Noise())
    while proposals := search.next():
        for subset in proposals:
            search.record(subset, V.FAIL)
    result = search.result()
    assert result.status is Status.GOOD_END_FAILS
    assert result.trials_used == 1  # noiseless: one failing good end settles it
    assert "good end fails" in result.message


def test_bad_end_passing_consistently_under_noise_stops_and_says_so():
    search = Search(names(6), noise=Noise(0.1, 0.1))
    while proposals := search.next():
        for subset in proposals:
            search.record(subset, V.PASS)
    result = search.result()
    assert result.status is Status.BAD_END_PASSES
    assert result.trials_used <= 8  # the bad end re-tested a few times, nothing else


def test_unexplained_when_no_set_up_to_max_order_fits():
    culprits = frozenset(names(8)[:3])  # a triple, searched with max_order=2
    search = Search(names(8), noise=Noise())
    run_noiseless(search, culprits)
    assert search.result().status is Status.UNEXPLAINED
    triple = Search(names(8), noise=Noise(), max_order=3)
    run_noiseless(triple, culprits)
    assert triple.result().culprits == culprits


def test_skipped_subsets_are_routed_around_and_never_proposed_again():
    candidates = names(8)
    culprit = frozenset({candidates[5]})
    search = Search(candidates, noise=Noise())
    skipped: set[frozenset[str]] = set()
    while proposals := search.next():
        for subset in proposals:
            assert subset not in skipped
            if subset and subset != frozenset(candidates) and len(skipped) < 3:
                skipped.add(subset)
                search.record(subset, V.CANNOT_TEST)
            else:
                search.record(subset, V.FAIL if culprit <= subset else V.PASS)
    result = search.result()
    assert len(skipped) >= 2
    assert result.status is Status.FOUND and result.culprits == culprit


def test_an_untestable_good_end_stops_the_search():
    search = Search(names(4), noise=Noise())
    search.record(frozenset(), V.CANNOT_TEST)
    assert search.next() == []
    assert search.result().status is Status.UNTESTABLE


def test_budget_stops_with_a_best_guess():
    search = Search(names(32), noise=Noise(0.2, 0.2), max_trials=6)
    rng = random.Random(3)
    culprit = frozenset({"p07"})
    while proposals := search.next():
        for subset in proposals:
            search.record(subset, oracle_outcome(subset, culprit, search.noise, rng))
    assert search.trials_used == 6
    assert search.result().status is Status.BUDGET


def test_replaying_records_gives_the_same_proposals():
    rng = random.Random(11)
    noise = Noise(0.1, 0.1)
    first = Search(names(12), noise=noise, parallel=2)
    culprit = frozenset({"p03", "p09"})
    history = []
    while (proposals := first.next()) and len(history) < 30:
        history.append(proposals)
        for subset in proposals:
            first.record(subset, oracle_outcome(subset, culprit, noise, rng))
    replay = Search(names(12), noise=noise, parallel=2)
    for proposals, record in zip(history, _chunks(first.records, 2)):
        assert replay.next() == proposals
        for r in record:
            replay.record(r.subset, r.outcome)
    assert replay.next() == first.next()


def _chunks(seq, k):  # records of each round, in order
    seq = list(seq)
    return [seq[i : i + k] for i in range(0, len(seq), k)]


def test_parallel_rounds_ask_different_questions():
    search = Search(names(16), noise=Noise(), parallel=4)
    culprit = frozenset({"p05"})
    rounds = 0
    while proposals := search.next():
        rounds += 1
        assert len(proposals) <= 4
        if search.phase == "search":
            assert len(set(proposals)) == len(proposals)
        for subset in proposals:
            search.record(subset, V.FAIL if culprit <= subset else V.PASS)
    assert search.result().culprits == culprit
    assert rounds <= 4  # 16 candidates: the ends, then 4 informative tests per round


def test_noisy_oracle_is_right_with_high_probability():
    noise = Noise(0.1, 0.1)
    candidates = names(12)
    right = 0
    for seed in range(40):
        rng = random.Random(seed)
        culprit = frozenset({candidates[seed % 12]})
        right += simulate(Search(candidates, noise=noise), culprit, noise, rng).correct
    assert right >= 37  # >= 92 % at the default confidence 0.95


def test_risk_tiers_steer_the_prior():
    weights = tier_weights({"a": 1, "b": 3, "c": 3, "d": 3})
    search = Search(["a", "b", "c", "d"], priors=Priors(weights=weights))
    marg = search.marginals()
    assert marg["a"] > marg["b"] == marg["c"]


def test_deciding_a_step_at_n64_with_pairs():  # its time: tests/benchmarks/budgets.py
    search = Search(names(64), noise=Noise(0.1, 0.1))
    assert search.space.n_sets == 2080
    search.record(frozenset(), V.PASS)
    search.record(frozenset(names(64)), V.FAIL)
    proposals = search.next()
    assert proposals and 0 < len(proposals[0]) < 64


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"noise": Noise(0.6, 0.5)}, "cannot tell good from bad"),
        ({"confidence": 1.0}, "confidence"),
        ({"parallel": 0}, "parallel"),
        ({"max_order": 4}, "max_order"),
        ({"max_trials": 1}, "two end checks"),
    ],
)
def test_bad_settings_are_errors_with_a_hint(kwargs, fragment):
    with pytest.raises(BisectError, match=fragment):
        Search(names(4), **kwargs)


def test_unknown_and_duplicate_candidates_are_errors():
    with pytest.raises(BisectError, match="listed twice"):
        Search(["a", "a"])
    with pytest.raises(BisectError, match="not a candidate"):
        Search(["a", "b"]).record({"zzz"}, V.PASS)
