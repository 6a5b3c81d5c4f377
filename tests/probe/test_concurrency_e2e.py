"""The probe's concurrency levels against the embedded engine's real server (slow): a level
above 1 keeps its requests in flight together, rows pair by (case, arm, level), and the verdict
states the conditions and the throughput per level. Correct against an engine that serves one
request at a time (requests queue) and against one that batches them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dsv4bisect.probe.runner import collect, judge
from dsv4bisect.probe.spec import tier_spec

from tests.probe.test_e2e_embedded import start_embedded

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = tier_spec("ci").replace(families=("needle", "copy", "drift"), lengths=(256, 512),
                               arms=("cold", "warm"), arm_plan="staggered", concurrency=(1, 4))


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from start_embedded("")


def test_levels_run_pair_and_are_reported(url: str) -> None:
    base = collect(url, SPEC)
    cand = collect(url, SPEC, reference_run=base)
    accuracy = [r for r in base.rows if r["family"] != "drift"]
    assert sorted((r["arm"], r["concurrency"]) for r in accuracy) == \
        [("cold", 1)] * 4 + [("warm", 4)] * 4
    assert {r["concurrency"] for r in base.rows if r["family"] == "drift"} == {1}
    assert set(base.rows_by_key()) == set(cand.rows_by_key())
    v = judge(base, cand, cand)
    assert v.verdict == "PASS"  # the same server twice; random weights: drift decides
    assert v.conditions["needle"]["requests"] == {"cold@1": 2, "warm@4": 2}
    assert v.conditions["drift"]["requests"] == {"drift@1": 2}
    for run in (base, cand):
        assert set(run.throughput) == {"1", "4"}
        assert run.throughput["4"]["requests"] == 4 and run.throughput["4"]["arms"] == ["warm"]
        assert run.throughput["4"]["tokens_per_s"] > 0
