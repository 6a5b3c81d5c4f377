"""The remedy check's rules (bisect/remedy.py): when it runs another trial and what it concludes."""

from __future__ import annotations

from dsv4bisect.bisect.remedy import Remedy, needs_more, prior_outcomes, remedy_subset
from dsv4bisect.bisect.search.records import Record
from dsv4bisect.probe import verdict as V

P, F, S = V.PASS, V.FAIL, V.CANNOT_TEST


def test_one_pass_settles_it_and_a_fail_is_checked_once_more() -> None:
    assert needs_more([], 0)
    assert not needs_more([P], 1)
    assert needs_more([F], 1)  # one FAIL can be the probe's false fail
    assert not needs_more([F, F], 2)
    assert needs_more([F], 0)  # a FAIL the search recorded counts: one more trial
    assert not needs_more([S, S], 2)  # cannot test: not retried forever


def test_verdicts() -> None:
    rest = frozenset({"a", "b"})
    assert Remedy(rest, (P,), 1).verdict == "passes"
    assert Remedy(rest, (F, F), 2).verdict == "fails"
    assert Remedy(rest, (F, P), 2).verdict == "mixed"
    assert Remedy(rest, (S, S), 2).verdict == "untested"
    assert Remedy(rest, (F, F), 1).to_json() == {"subset": ["a", "b"], "verdict": "fails",
                                                 "outcomes": ["fail", "fail"], "trials_run": 1}


def test_the_subset_is_the_bad_end_without_the_culprits() -> None:
    assert remedy_subset(("a", "b", "c"), frozenset({"b"})) == {"a", "c"}
    assert remedy_subset(("a", "b"), frozenset({"a", "b"})) == frozenset()
    assert remedy_subset(("a",), None) == frozenset()
    records = [Record(frozenset({"a", "c"}), F), Record(frozenset({"a"}), P),
               Record(frozenset({"a", "c"}), P)]
    assert prior_outcomes(records, frozenset({"a", "c"})) == [F, P]
