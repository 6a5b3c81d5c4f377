"""The information a round of subsets carries, against a brute-force computation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dsv4bisect.bisect.search.design import Noise, RoundDesign, capacity, information_bound
from dsv4bisect.bisect.search.hypotheses import HypothesisSpace, Priors


def brute_force_info(space: HypothesisSpace, post: np.ndarray, noise: Noise, tests) -> float:
    """I(outcomes; hypothesis) by enumerating hypotheses and observed outcome patterns."""
    k, n = len(tests), len(space.candidates)
    ff, fp = noise.false_fail, noise.false_pass

    def p_fail(h: int, t: np.ndarray) -> float:
        if h < space.n_sets:
            truly = bool(space.contained(t)[h])
        elif h == space.n_sets:  # good end fails: everything fails
            truly = True
        elif h == space.n_sets + 1:  # bad end passes: everything passes
            truly = False
        elif not t.any() or t.all():  # unexplained: the ends behave, the rest is a coin
            truly = bool(t.all())
        else:
            return 0.5
        return 1 - fp if truly else ff

    joint = {}
    cond = 0.0
    for h, ph in enumerate(post):
        probs = [p_fail(h, t) for t in tests]
        for pattern in itertools.product((0, 1), repeat=k):
            p = ph * math.prod(q if o else 1 - q for o, q in zip(pattern, probs))
            joint[pattern] = joint.get(pattern, 0.0) + p
            if p > 0:
                cond -= p * math.log2(p / ph)
    marginal = -sum(p * math.log2(p) for p in joint.values() if p > 0)
    assert n == tests[0].size
    return marginal - cond


@pytest.mark.parametrize("noise", [Noise(), Noise(0.1, 0.2), Noise(0.0, 0.5)])
def test_joint_information_matches_brute_force(noise):
    space = HypothesisSpace([f"p{i}" for i in range(5)], 2, Priors())
    rng = np.random.default_rng(0)
    post = rng.random(space.n_hypotheses)
    post /= post.sum()
    tests = [np.array(t, np.uint8) for t in ([1, 1, 0, 0, 1], [0, 1, 1, 0, 0], [1, 1, 1, 1, 1])]
    design = RoundDesign(space, post, noise)
    for j, t in enumerate(tests):
        expected = brute_force_info(space, post, noise, tests[: j + 1])
        assert design.info_of(t) == pytest.approx(expected, abs=1e-9)
        design.commit(t)


def test_greedy_growth_halves_a_uniform_single_culprit_posterior():
    space = HypothesisSpace([f"p{i}" for i in range(16)], 1, Priors())
    post = np.exp(space.log_prior)
    post[space.n_sets :] = 0
    post /= post.sum()
    chosen = RoundDesign(space, post, Noise()).grow(np.zeros(16, np.uint8))
    assert chosen.sum() == 8


def test_capacity_of_the_probe_channel():
    assert capacity(Noise()) == pytest.approx(1.0)
    assert capacity(Noise(0.1, 0.1)) == pytest.approx(0.531, abs=1e-3)
    assert capacity(Noise(0.0, 0.5)) == pytest.approx(0.322, abs=1e-3)


def test_information_bound_matches_the_issue():
    assert information_bound(32, 1, Noise()) == pytest.approx(5.0)
    assert math.ceil(information_bound(32, 2, Noise())) == 9
    assert information_bound(32, 1, Noise(0.1, 0.1)) == pytest.approx(9.4, abs=0.05)
