"""The bad end's check: run first where trials are judged against the ends' measurements, done
by the first FAIL where they are not (a `--test-cmd`), at no cost in correctness under noise."""

from __future__ import annotations

import itertools
import random
import sys
from pathlib import Path

import pytest
from simulated import simulate  # tests/bisect/simulated.py

from dsv4bisect.bisect import remedy as rem
from dsv4bisect.bisect.driver import start_bisect
from dsv4bisect.bisect.ledger import Ledger
from dsv4bisect.bisect.plan.costs import plan_costs
from dsv4bisect.bisect.question import resolve_question
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.hypotheses import tier_weights
from dsv4bisect.bisect.search.pricing import StepCosts
from dsv4bisect.bisect.search.search import Search, Status
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.testcmd import TestCommandRunner
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.probe import verdict as V

CHECK = Path(__file__).parent / "fake_check.py"  # exits 1 when the culprit is switched on
NAMES = tuple(f"p{i}" for i in range(8))
EVERYTHING = frozenset(NAMES)
TEST_CMD = StepCosts()  # what a --test-cmd prices: nothing is measured at the ends


def test_the_bad_end_runs_first_only_where_trials_are_judged_against_the_ends() -> None:
    assert Search(NAMES).next() == [frozenset()]
    for costs in (None, StepCosts(paired=True), StepCosts(sequential=True)):
        search = Search(NAMES, costs=costs)
        search.record(frozenset(), V.PASS)
        assert search.phase == "ends" and search.next() == [EVERYTHING]
    search = Search(NAMES, costs=TEST_CMD)
    assert search.next() == [frozenset()]
    search.record(frozenset(), V.PASS)
    assert search.phase == "search" and search.ends_known
    assert EVERYTHING not in search.next()  # the design asks a question about the sets
    assert Search(NAMES, costs=TEST_CMD, bad_end_first=True).next() == [frozenset()]


def test_a_failing_good_end_is_still_rechecked_before_the_search() -> None:
    search = Search(NAMES, noise=Noise(0.1, 0.1), costs=TEST_CMD)
    search.record(frozenset(), V.FAIL)
    assert search.phase == "ends" and search.next()[0] in (frozenset(), EVERYTHING)


@pytest.mark.parametrize("noise", [Noise(), Noise(0.05, 0.05), Noise(0.1, 0.1)])
def test_a_bad_end_that_passes_is_run_and_reported(noise: Noise) -> None:
    """Every configuration truly passes (the failure does not reproduce): the search ends on
    `bad-end-passes`, having run the bad end (its check), however long it took to suspect it."""
    right = 0
    for seed in range(40):
        rng = random.Random(seed)
        search = Search(NAMES, noise=noise, costs=TEST_CMD, max_trials=400)
        while proposals := search.next():
            for subset in proposals:
                flip = rng.random() < noise.false_fail
                search.record(subset, V.FAIL if flip else V.PASS)
        result = search.result()
        if result.status is Status.BAD_END_PASSES:
            right += 1
            assert any(r.subset == EVERYTHING for r in search.records)
    assert right / 40 >= 0.95


@pytest.mark.parametrize(("noise", "runs"), [(Noise(0.1, 0.1), 120), (Noise(0.0, 0.5), 80)])
def test_under_noise_the_optional_bad_end_loses_no_correctness_and_saves_trials(
        noise: Noise, runs: int) -> None:
    """Singles and pairs among eight candidates, the probe flipping outcomes at the rates the
    search is told (10 % two-sided; a bad configuration passing half the time): the same
    culprits and seeds with the bad end first and with its check left to the first FAIL."""
    pairs = list(itertools.combinations(NAMES, 2))
    figures = {}
    for first in (True, False):
        correct = trials = 0
        for i in range(runs):
            culprits = frozenset(pairs[i % len(pairs)] if i % 2 else (NAMES[i % 8],))
            search = Search(NAMES, noise=noise, costs=TEST_CMD, bad_end_first=first,
                            max_trials=400)
            run = simulate(search, culprits, noise, random.Random(i))
            correct += run.correct
            trials += run.trials
        figures[first] = (correct / runs, trials / runs)
    assert figures[False][0] >= min(figures[True][0], 0.97), figures
    assert figures[False][1] < figures[True][1], figures


CULPRITS = ("mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer", "nvfp4-dispatch")


def test_a_test_cmd_bisect_of_reference_all_makes_at_most_six_calls_on_average(
        tmp_path: Path) -> None:
    """The bisect `dsv4bisect bisect --test-cmd` runs on reference-all with default settings
    (5 %/5 % assumed, the risk tiers' prior weights, the test command's costs), driven through
    the driver with a real test command: every call counted, the end checks and the remedy
    check included. Before: 6, 6, 7, 7, 8 (unpriced), then 5, 6, 6, 7, 7 (priced, both ends
    first)."""
    q = resolve_question("reference-all", Overrides())
    assert q.candidates == CULPRITS
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad,
                      weights=tier_weights(q.tiers), costs=plan_costs(None, None, given={}).costs)
    counts = {}
    with Ledger.open(tmp_path / "ledger.sqlite") as ledger:
        for culprit in CULPRITS:
            log = tmp_path / f"{culprit}.log"
            runner = TestCommandRunner([sys.executable, str(CHECK), str(log), culprit])
            out = start_bisect(spec, runner, ledger, tmp_path / culprit)
            assert out.result.status is Status.FOUND and out.result.culprits == {culprit}
            assert out.remedy is not None and out.remedy.verdict == rem.PASSES
            counts[culprit] = sum(line.startswith("start") for line in log.read_text().splitlines())
            assert counts[culprit] == out.trials_run
    assert counts == {"mhc-bf16": 4, "hash-topk-scaling": 5, "mma-decode": 5,
                      "triton-indexer": 6, "nvfp4-dispatch": 7}
    assert sum(counts.values()) / len(counts) <= 6
