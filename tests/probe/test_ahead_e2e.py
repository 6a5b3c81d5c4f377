"""A candidate's probe in two parts (probe/ahead.py) on the embedded engine's real HTTP servers
(ci tier, `--precision exact`): the accuracy part before the good end's run exists, the drift
scoring after, is the candidate's normal probe in every row but timing, and judges the same;
sharded across two replicas too."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from dsv4bisect.probe.ahead import (
    OtherCases,
    collect_ahead,
    collect_ahead_sharded,
    finish_ahead,
    finish_ahead_sharded,
)
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import collect, judge
from dsv4bisect.probe.shards import same_content
from dsv4bisect.probe.spec import tier_spec
from tests.probe.test_e2e_embedded import start_embedded

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

SPEC = tier_spec("ci")
FAULT = "hash-topk-scaling:double-scale"  # a bad end that drifts (and may lose answers)


@pytest.fixture(scope="module")
def good() -> Iterator[str]:
    yield from start_embedded("", "--precision", "exact")


@pytest.fixture(scope="module")
def bad() -> Iterator[str]:
    yield from start_embedded(FAULT, "--precision", "exact")


def _verdict(base: ProbeRun, run: ProbeRun) -> dict:
    return {k: v for k, v in judge(base, None, run).to_dict().items() if k != "throughput"}


def test_the_bad_end_ahead_of_the_good_end_is_its_normal_probe(good: str, bad: str) -> None:
    ahead = collect_ahead(bad, SPEC)  # before any good-end run exists
    assert ahead.rows and not ahead.drift
    assert all(r["arm"] != "drift" for r in ahead.rows)
    base = collect(good, SPEC)
    one = collect(bad, SPEC, reference_run=base)
    two = finish_ahead(bad, ahead, base)
    assert same_content(two, one) == []
    assert [r["arm"] for r in two.rows] == [r["arm"] for r in one.rows]
    assert two.drift and _verdict(base, two) == _verdict(base, one)
    # sharded across two replicas: the same run again
    aheads = collect_ahead_sharded([bad, bad], SPEC)
    merged = finish_ahead_sharded([bad, bad], aheads, base)
    assert same_content(merged, one) == [] and merged.shard["count"] == 2
    assert all(p["rows"] > 0 for p in merged.shard["parts"])


def test_other_cases_than_the_good_ends_are_refused(good: str, bad: str) -> None:
    base = collect(good, SPEC)
    ahead = collect_ahead(bad, SPEC)
    other = replace(base, cases=base.cases[1:])
    with pytest.raises(OtherCases):
        finish_ahead(bad, ahead, other)
