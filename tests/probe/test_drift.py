"""Drift metrics: KL over the top-k union with a tail bucket, top-1 agreement, divergence."""

from __future__ import annotations

import math

import pytest

from dsv4bisect.probe.drift import DriftRecord, compare, percentile, position_kl, summarise


def lp(*probs: float) -> list[float]:
    return [math.log(p) for p in probs]


def test_identical_top_k_gives_zero() -> None:
    top = dict(zip([5, 9, 2], lp(0.5, 0.3, 0.1)))
    assert position_kl(top, top) == 0.0


def test_full_support_equals_textbook_kl() -> None:
    p, q = [0.5, 0.3, 0.2], [0.4, 0.4, 0.2]
    want = sum(a * math.log(a / b) for a, b in zip(p, q))
    got = position_kl(dict(enumerate(lp(*p))), dict(enumerate(lp(*q))))
    assert got == pytest.approx(want, rel=1e-9)


def test_disjoint_top_k_uses_the_tail_and_stays_finite() -> None:
    p = dict(zip([1, 2], lp(0.6, 0.3)))
    q = dict(zip([3, 4], lp(0.6, 0.3)))
    kl = position_kl(p, q)
    assert 0.5 < kl < 10


def record(case: str, tops: list[list[tuple[int, float]]], start: int = 3) -> DriftRecord:
    n = len(tops)
    return DriftRecord(case, tuple(range(start + n)), start, tuple(range(start, start + n)),
                       tuple(t[0][1] for t in tops), tuple(tuple(t) for t in tops))


def test_compare_and_summarise() -> None:
    a = [[(7, math.log(0.9)), (8, math.log(0.05))]] * 4
    b = [*a[:2], [(8, math.log(0.6)), (7, math.log(0.3))], a[3]]
    cmp = compare(record("x", a), record("x", b))
    assert cmp.top1_same == (True, True, False, True) and cmp.first_divergence == 5
    assert cmp.kl[0] == 0.0 and cmp.kl[2] > 0.5
    s = summarise([cmp, compare(record("y", a), record("y", a))])
    assert s.n_cases == 2 and s.n_positions == 8 and s.cases_diverged == 1
    assert s.top1_agreement == pytest.approx(7 / 8) and s.first_divergence == 5
    near = s.by_position["0-255"]
    assert near["n"] == 8 and near["top1_agreement"] == pytest.approx(7 / 8)
    assert near["nll_delta"] == pytest.approx((-math.log(0.6) + math.log(0.9)) / 8)
    assert summarise([]) is None


def test_records_of_different_transcripts_are_refused() -> None:
    a = record("x", [[(1, -0.1)]])
    b = DriftRecord("x", (9, 9, 9, 9), 3, (3,), (-0.1,), (((1, -0.1),),))
    with pytest.raises(ValueError, match="different token ids"):
        compare(a, b)


def test_percentile() -> None:
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([0.0, 1.0], 99) == pytest.approx(0.99)
    rec = record("z", [[(1, -0.5), (2, -1.5)]])
    assert DriftRecord.from_dict(rec.to_dict()) == rec
