"""The exact floor on one node (bisect/plan/exact_floor.py): the noiseless problem's optimum,
by hand on the smallest case, against a brute force on small ones, and under the plan's own
search."""

from __future__ import annotations

import itertools
import math
import random
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dsv4bisect.bisect.plan.exact_floor import (
    _genie_value,
    _problem,
    _Symmetry,
    exact_floor,
    noisy_floor,
)
from dsv4bisect.bisect.plan.parallel_plan import floor_run
from dsv4bisect.bisect.plan.simulate import Setup, search_memo, simulate
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.hypotheses import HypothesisSpace, Priors
from dsv4bisect.bisect.search.pricing import StepCosts

# SGLang-like: one engine a node, a hot switch, the sequential trial probe (good 100 s, bad 50 s)
HOT = StepCosts(launch_s=600, switch_s=90, probe_s=1000, aa_fraction=0.19, sequential=True,
                like_good_fraction=0.1, like_bad_fraction=0.05, hot=True, pool=1,
                load_time=frozenset(), paired=True)


def _setup(candidates, costs=HOT) -> Setup:
    return Setup(tuple(candidates), Noise(0.05, 0.05), Noise(0.01, 0.01), costs, confirm=False)


def test_two_call_time_candidates_by_hand():
    """Sets {a} 0.25, {b} 0.25, {a, b} 0.5 (the flat prior: half on singles); the only
    informative trials are {a} and {b}, each a switch (90 s). Trial {a}: 90 + 0.25 x 50 +
    0.75 x 100. It fails ({a}): the remedy check {b} is still to run, 90 + 100, weight 0.25. It
    passes: trial {b}, 90 + 0.25 x 50 + 0.5 x 100, weight 0.75 for the switch; it fails ({b}:
    its remedy {a} already passed) or passes ({a, b}: nothing left to switch off). 355 s after
    the ends, whichever trial comes first."""
    setup = _setup("ab")
    floor = exact_floor(setup, miss=0)
    assert floor.ends_s == pytest.approx(floor_run(setup, 1, frozenset("ab")))
    assert floor.certain_s - floor.ends_s == pytest.approx(355.0)
    assert floor.trials == pytest.approx(0.25 * 2 + 0.25 * 2 + 0.5 * 2)
    assert floor.launches == 0


def _brute(setup: Setup) -> float:
    """The same optimum by plain recursion over frozensets: no masks, no table, no pruning."""
    c = setup.costs
    space = HypothesisSpace(setup.candidates, setup.max_order, Priors())
    weights = np.exp(space.log_prior[: space.n_sets])
    prior = {space.hypothesis(i).members: float(w / weights.sum()) for i, w in enumerate(weights)}
    everything = frozenset(setup.candidates)
    subsets = [frozenset(s) for n in range(1, len(everything))
               for s in itertools.combinations(sorted(everything), n)]

    def engine(up, subset):
        return c.switch_s if c.hot and up == subset & c.load_time else c.launch_s

    def probe(truth, subset):
        return c.probe_s * (c.like_bad_fraction if truth <= subset else c.like_good_fraction)

    def best(left: frozenset, up, tested: frozenset) -> float:
        if len(left) == 1:  # one set left: its remedy check, unless a trial ran it
            (named,) = left
            rest = everything - named
            if not rest or rest in tested:
                return 0.0
            return prior[named] * (engine(up, rest) + probe(named, rest))
        out = math.inf
        for subset in subsets:
            fail = frozenset(h for h in left if h <= subset)
            if not fail or fail == left:
                continue
            cost = sum(prior[h] * (engine(up, subset) + probe(h, subset)) for h in left)
            state = subset & c.load_time
            now = tested | {subset}
            out = min(out, cost + best(fail, state, now) + best(left - fail, state, now))
        return out

    return min(best(frozenset(prior), up, frozenset()) for up in (frozenset(), c.load_time))


@pytest.mark.parametrize("candidates, load_time", [("abc", ""), ("abc", "a"), ("abc", "ab")])
def test_the_table_is_the_brute_force_optimum(candidates, load_time):
    setup = _setup(candidates, replace(HOT, load_time=frozenset(load_time)))
    floor = exact_floor(setup, miss=0)
    assert floor.certain_s - floor.ends_s == pytest.approx(_brute(setup))


def test_a_wrong_name_allowed_lowers_the_floor_never_raises_it():
    setup = _setup("abcd", replace(HOT, load_time=frozenset("a")))
    certain = exact_floor(setup, miss=0)
    loose = exact_floor(setup, miss=0.05)
    assert loose.bound_s <= certain.certain_s == loose.certain_s
    assert loose.bound_s < certain.certain_s  # at 5 % a policy can skip some checks


def test_ends_from_a_cache_leave_no_engine_up():
    setup = _setup("abc", replace(HOT, load_time=frozenset("a")))
    cached = exact_floor(replace(setup, costs=replace(setup.costs, ends0_cached=True)), miss=0)
    assert cached.ends_s == 0
    assert cached.launches >= 1  # the first trial launches, whatever it is


def _plans_search(setup: Setup) -> tuple[float, float]:
    """The plan's search on one node, simulated 8 times on every culprit set of the world's
    prior with noisy trials and weighted by that prior: its mean wall and P(wrong)."""
    space = HypothesisSpace(setup.candidates, setup.max_order, Priors())
    weights = np.exp(space.log_prior[: space.n_sets])
    weights = weights / weights.sum()
    memo = search_memo(setup, 1, True)
    wall = wrong = 0.0
    for i, w in enumerate(weights):
        culprits = space.hypothesis(i).members
        runs = [simulate(setup, 1, culprits, random.Random(seed), True, memo) for seed in range(8)]
        wall += w * np.mean([r.wall_s for r in runs])
        wrong += w * np.mean([not r.correct for r in runs])
    return wall, wrong


def test_the_plans_own_search_never_beats_the_floor():
    """The plan's search, simulated on every culprit set of the world's prior with noisy
    trials, weighted by that prior, spends at least the floor at its own rate of wrong names:
    the floor prices trials as the plan's `CostTracker` does."""
    setup = _setup("abcd", replace(HOT, load_time=frozenset("a")))
    wall, wrong = _plans_search(setup)
    floor = exact_floor(setup, miss=wrong)
    assert floor.bound_s <= wall


def _small(load_time: str = "a"):
    """The noiseless table of four candidates."""
    return _problem(_setup("abcd", replace(HOT, load_time=frozenset(load_time))))


@pytest.mark.parametrize("price", [500.0, 4000.0])
def test_the_genie_without_noise_is_the_noiseless_table(price):
    problem = _small()
    genie, _ = _genie_value(problem, price, 0.0, None)
    assert genie == pytest.approx(problem.solve(price)[0])


@pytest.mark.parametrize("load_time", ["", "a", "ab"])
def test_states_equal_under_the_candidates_symmetry_share_one_entry(load_time):
    problem = _small(load_time)
    whole, states = _genie_value(problem, 3000.0, 0.01, None)
    shared, fewer = _genie_value(problem, 3000.0, 0.01, _Symmetry(problem, 4))
    assert shared == pytest.approx(whole)
    assert fewer < states


def test_noise_raises_the_floor():
    problem = _small()
    for price in (1000.0, 4000.0):
        assert _genie_value(problem, price, 0.01, None)[0] > problem.solve(price)[0]


def test_the_plans_own_search_never_beats_the_genies_floor():
    """As above, at the plan's trial error rate (1 % either way): the search is one of the
    policies the genie's bound holds for."""
    setup = _setup("abcd", replace(HOT, load_time=frozenset("a")))
    wall, wrong = _plans_search(setup)
    floor, _, _ = noisy_floor(setup, miss=wrong, prices=(1000.0, 4000.0, 16000.0))
    assert exact_floor(setup, miss=wrong).bound_s < floor <= wall


@pytest.fixture(scope="module")
def genie_program(tmp_path_factory):
    """tests/benchmarks/genie_floor.c compiled: the genie's table in C, for six candidates."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import genie_floor

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")
    return genie_floor, genie_floor.compile_program(tmp_path_factory.mktemp("genie"))


@pytest.mark.parametrize(("candidates", "load_time", "symmetric"),
                         [("abcd", "", True), ("abcd", "a", True), ("abcd", "ab", False),
                          pytest.param("abcde", "ab", True, marks=pytest.mark.slow)])  # ~7 min
def test_the_c_genie_is_the_python_genie(genie_program, candidates, load_time, symmetric):
    """The benchmark's C table (the one fast enough for six candidates) gives the Python
    table's value over the same states, with and without the symmetry, from the ends' engines
    and from a cache."""
    genie_floor, binary = genie_program
    for cached in (False, True):
        costs = replace(HOT, load_time=frozenset(load_time), ends0_cached=cached)
        problem = _problem(_setup(candidates, costs))
        symmetry = _Symmetry(problem, len(candidates)) if symmetric else None
        for price in (1000.0, 16000.0):
            text = genie_floor.problem_text(problem, symmetry, 0.01, price)
            value, states = genie_floor.run_program(binary, text)
            mine, visited = _genie_value(problem, price, 0.01, symmetry)
            assert value == pytest.approx(mine, rel=1e-9)
            assert states == visited  # the same states, pruned alike
