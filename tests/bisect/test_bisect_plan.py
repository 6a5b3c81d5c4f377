"""`--plan`: a deterministic, fast simulation of the search before anything launches."""

from __future__ import annotations

import time

import pytest

from dsv4bisect.bisect.plan.plan import plan
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.errors import BisectError


def test_the_plan_is_deterministic_given_a_seed():
    a = plan(6, Noise(0.1, 0.1), trials=20, seed=3)
    b = plan(6, Noise(0.1, 0.1), trials=20, seed=3)
    assert a == b
    assert plan(6, Noise(0.1, 0.1), trials=20, seed=4) != a


def test_six_candidates_plan_quickly_with_sane_figures():
    start = time.perf_counter()
    p = plan(6, Noise(), launch_cost_s=300, probe_cost_s=100)
    assert time.perf_counter() - start < 5.0
    assert p.runs == 100 and p.p_correct == 1.0 and p.warning is None
    assert 2 + 2 <= p.mean_launches <= p.p90_launches <= p.max_launches <= 2 + 15
    assert p.mean_wall_s == pytest.approx(p.mean_launches * 400)  # one trial per round


def test_noise_costs_launches_and_parallel_saves_wall_time():
    quiet = plan(8, Noise(), trials=25)
    noisy = plan(8, Noise(0.1, 0.1), trials=25)
    assert noisy.mean_launches > quiet.mean_launches
    assert noisy.bits_per_trial == pytest.approx(0.531, abs=1e-3)
    wide = plan(8, Noise(), trials=25, parallel=4)
    assert wide.mean_wall_s < quiet.mean_wall_s


def test_a_probe_that_cannot_separate_the_ends_within_budget_is_flagged():
    p = plan(6, Noise(0.4, 0.4), trials=30, max_trials=4)
    assert p.warning is not None and "cannot separate the good and bad ends" in p.warning
    assert p.end_checks_needed > 4
    assert plan(6, Noise(0.05, 0.05), trials=10).end_checks_needed == 2


def test_bad_arguments_are_errors():
    with pytest.raises(BisectError):
        plan(6, trials=0)
    with pytest.raises(BisectError):
        plan(3, candidates=["a", "b"])
