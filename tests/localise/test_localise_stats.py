"""Each site's envelope from the null arms, and a candidate's multiple of it (localise/stats.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from dsv4bisect.localise.sites import Compared
from dsv4bisect.localise.stats import FLOOR, envelope, judge


def _c(d: np.ndarray, seq: int = 0) -> Compared:
    return Compared(np.full(len(d), seq), np.arange(len(d)), np.asarray(d, dtype=np.float64))


def _null(rng: np.random.Generator, n: int = 512, arms: int = 3) -> list[tuple[str, Compared]]:
    """Harmless arms: mostly fp32 reorderings (1e-7), a rare flip of a rounding (1e-2)."""
    out = []
    for a in range(arms):
        d = rng.uniform(0, 2e-7, n)
        d[rng.integers(0, n, 2)] = 1e-2
        out.append((f"arm{a}", _c(d)))
    return out


def test_a_candidate_drawn_like_the_null_is_inside_and_a_real_change_outside() -> None:
    rng = np.random.default_rng(1)
    null = _null(rng)
    like = _null(np.random.default_rng(2), arms=1)[0][1]
    env = envelope("site", null, len(like.d), tests=200)
    assert judge(like, env).multiple <= 1.0
    # a bf16 rounding at every position (2e-3 relative): far outside
    shifted = _c(np.full(512, 2e-3))
    j = judge(shifted, envelope("site", null, 512, tests=200, candidate_mean=2e-3))
    assert j.is_outside and j.multiple > 10


def test_the_envelope_never_goes_below_the_fp32_floor() -> None:
    """A held-out arm that happened to be bit-identical does not make an fp32 reordering of
    the candidate infinitely many times its envelope."""
    zero = [("arm", _c(np.zeros(256)))]
    reorder = _c(np.full(256, 3e-8))
    j = judge(reorder, envelope("site", zero, 256, tests=10, candidate_mean=3e-8))
    assert j.envelope.bound == FLOOR and not j.is_outside


def test_outside_positions_are_those_past_the_nulls_peak_in_order() -> None:
    null = [("arm", _c(np.full(128, 1e-4)))]
    d = np.zeros(128)
    d[[90, 7, 40]] = 0.5
    j = judge(_c(d), envelope("site", null, 128, tests=1, candidate_mean=float(d.mean())))
    assert j.outside == ((0, 7), (0, 40), (0, 90))


def test_the_bootstrap_is_deterministic_per_site() -> None:
    null = _null(np.random.default_rng(3))
    a = envelope("layers.0:x:0", null, 300, tests=50, candidate_mean=1.0)
    b = envelope("layers.0:x:0", null, 300, tests=50, candidate_mean=1.0)
    assert a == b


@given(st.integers(min_value=0, max_value=2**31 - 1))
def test_more_sites_judged_never_narrow_the_envelope(seed: int) -> None:
    """Bonferroni: judging more sites raises the quantile, never lowers the bound."""
    null = _null(np.random.default_rng(seed), n=256)
    few = envelope("s", null, 256, tests=2, candidate_mean=1.0)
    many = envelope("s", null, 256, tests=500, candidate_mean=1.0)
    assert many.bound >= few.bound
