"""Statistics against published values (sources next to each number)."""

from __future__ import annotations

import math

import pytest

from dsv4bisect.probe import stats


def test_mcnemar_one_sided_exact_values() -> None:
    # All-discordant-one-way: p = 2^-b (binomial, exact). 7 losses are the first below 0.01.
    assert stats.mcnemar_one_sided(7, 0) == 2**-7 == 0.0078125
    assert stats.mcnemar_one_sided(6, 0) == 0.015625
    # R: binom.test(10, 12, 0.5, alternative = "greater")$p.value = 0.01928711 (= 79/4096).
    assert stats.mcnemar_one_sided(10, 2) == pytest.approx(79 / 4096, abs=1e-15)
    assert stats.mcnemar_one_sided(0, 0) == 1.0
    assert stats.mcnemar_one_sided(0, 5) == 1.0


def test_mcnemar_two_sided_published_example() -> None:
    # Fagerland, Lydersen & Laake (2013), BMC Med Res Methodol 13:91, Table 1 example
    # (b = 1, c = 7): exact conditional McNemar p = 0.070 (= 18/256).
    assert stats.mcnemar_two_sided(1, 7) == pytest.approx(0.0703125)
    assert stats.mcnemar_two_sided(7, 1) == pytest.approx(0.0703125)
    assert stats.mcnemar_two_sided(3, 3) == 1.0


def test_min_significant_discordant() -> None:
    assert stats.min_significant_discordant(0.01) == 7
    assert stats.min_significant_discordant(0.05) == 5
    assert stats.min_significant_discordant(0.0625) == 5  # 2^-4 is not < 2^-4


def test_holm_matches_r_p_adjust() -> None:
    # R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") = 0.03 0.06 0.06 0.02 (Holm 1979).
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([]) == []


@pytest.mark.parametrize(("k", "n", "lo", "hi"), [
    # Newcombe (1998), Stat Med 17:857-872, Table I, method 3 (Wilson score, no correction).
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_wilson_matches_newcombe_1998(k: int, n: int, lo: float, hi: float) -> None:
    got = stats.wilson(k, n)
    assert got[0] == pytest.approx(lo, abs=5e-5)
    assert got[1] == pytest.approx(hi, abs=5e-5)


def test_rule_of_three_and_exact_zero_bound() -> None:
    # Hanley & Lippman-Hand (1983): 0 events in n -> 95 % upper bound ~ 3/n.
    assert stats.rule_of_three(60) == 0.05
    assert stats.zero_event_bound(60) == pytest.approx(1 - 0.05 ** (1 / 60))
    assert abs(stats.zero_event_bound(300) - stats.rule_of_three(300)) < 2e-4


def test_detection_probability_and_min_rate() -> None:
    # probe-anchors §6.4.7: 60 cases detect a 5 % failure rate with 1 - 0.95^60 = 0.954.
    assert stats.detection_probability(60, 0.05, 1) == pytest.approx(1 - 0.95**60)
    q = stats.min_detectable_rate(60, 1)
    assert q == pytest.approx(1 - 0.05 ** (1 / 60), rel=1e-9)  # P(>=1) = 0.95 exactly
    q7 = stats.min_detectable_rate(36, 7)
    assert stats.binom_sf(7, 36, q7) == pytest.approx(0.95, abs=1e-9)
    assert stats.min_detectable_rate(6, 7) is None
    assert stats.min_detectable_rate(7, 7) == pytest.approx(0.95 ** (1 / 7), rel=1e-9)  # q^7 = 0.95


def test_binom_sf_edges() -> None:
    assert stats.binom_sf(0, 5, 0.3) == 1.0
    assert stats.binom_sf(6, 5, 0.3) == 0.0
    assert stats.binom_sf(3, 5, 0.5) == pytest.approx(0.5)
    assert math.isclose(stats.binom_sf(1, 10, 0.1), 1 - 0.9**10)
