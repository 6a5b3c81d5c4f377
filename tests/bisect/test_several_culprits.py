"""Patches that each fail alone: named as several culprits, never "the good end fails"."""

from __future__ import annotations

import random

import pytest

from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.search import Search, Status
from dsv4bisect.probe import verdict as V

REFERENCE = ["mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer", "nvfp4-dispatch",
             "trtllm-clamp"]
FAILING = frozenset({"mhc-bf16", "mma-decode", "triton-indexer"})  # each fails on its own


def any_of(bad: frozenset[str], subset: frozenset[str]) -> str:
    return V.FAIL if bad & subset else V.PASS


def drive(search: Search, truth, rng: random.Random | None = None, flip: float = 0.0) -> list:
    tested = []
    while proposals := search.next():
        for subset in proposals:
            outcome = truth(subset)
            if rng is not None and rng.random() < flip:
                outcome = V.PASS if outcome == V.FAIL else V.FAIL
            tested.append((subset, outcome))
            search.record(subset, outcome)
        assert len(tested) < 200
    return tested


@pytest.mark.parametrize("parallel", [1, 3])
def test_three_independently_failing_patches_are_named(parallel: int) -> None:
    search = Search(REFERENCE, noise=Noise(), parallel=parallel)
    tested = drive(search, lambda s: any_of(FAILING, s))
    first = search.result()  # one of them, sufficient and minimal under the one-set model
    if first.status is Status.FOUND:  # the driver's remedy check then fails: another remains
        assert first.culprits is not None and first.culprits <= FAILING
        assert any_of(FAILING, frozenset(REFERENCE) - first.culprits) == V.FAIL
        for subset in search.singles_to_test():
            outcome = any_of(FAILING, subset)
            tested.append((subset, outcome))
            search.record(subset, outcome)
    result = search.result()
    assert result.status is Status.SEVERAL, result.message
    assert result.culprits == FAILING
    assert "several culprits" in result.message and "mma-decode" in result.message
    assert all(o == V.PASS for s, o in tested if not s)  # the good end passed every time
    assert {s for s, _ in tested} >= {frozenset({c}) for c in REFERENCE}


def test_under_noise_never_good_end_fails_while_the_good_end_passed() -> None:
    for seed in range(20):
        search = Search(REFERENCE, noise=Noise(0.02, 0.02))
        tested = drive(search, lambda s: any_of(FAILING, s), random.Random(seed), flip=0.02)
        result = search.result()
        good = [o for s, o in tested if not s]
        if good and all(o == V.PASS for o in good):
            assert result.status is not Status.GOOD_END_FAILS, (seed, result.message)


def test_a_single_culprit_is_still_found_as_one() -> None:
    search = Search(REFERENCE, noise=Noise())
    drive(search, lambda s: any_of(frozenset({"mma-decode"}), s))
    result = search.result()
    assert result.status is Status.FOUND and result.culprits == frozenset({"mma-decode"})


def test_a_broken_good_end_is_still_said() -> None:
    search = Search(REFERENCE, noise=Noise())
    drive(search, lambda s: V.FAIL)
    assert search.result().status is Status.GOOD_END_FAILS
