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


HIT = tier_spec("ci").replace(families=("needle", "copy"), lengths=(256, 512),
                              arms=("cold", "hit"))


def test_the_hit_arm_is_a_whole_prompt_hit_paired_and_replayed_alone(url: str) -> None:
    """The hit arm's scored request is served whole from the prefix cache (the server's
    cached_tokens), answers as the cold request did (the same state and logits), pairs by
    (case, hit, 1), and a sequential trial's lone replay of it (after whatever another request
    left cached) is a whole hit again."""
    from dsv4bisect.probe.client import ProbeClient
    from dsv4bisect.probe.runner import chat_row

    base = collect(url, HIT)
    cand = collect(url, HIT, reference_run=base)
    rows = base.rows_by_key()
    hits = [r for r in base.rows if r["arm"] == "hit"]
    assert len(hits) == 4 and {r["concurrency"] for r in hits} == {1}
    for r in hits:
        assert r["cached_tokens"] == r["prompt_tokens"]
        assert r["output"] == rows[(r["case_id"], "cold", 1)]["output"]
    assert all(r["cached_tokens"] == 0 for r in base.rows if r["arm"] == "cold")
    assert set(base.rows_by_key()) == set(cand.rows_by_key())
    assert judge(base, cand, cand).conditions["needle"]["requests"] == {"cold@1": 2, "hit@1": 2}
    client = ProbeClient(url, timeout_s=HIT.timeout_s)
    try:
        case = next(c for c in base.cases if c.case_id == hits[-1]["case_id"])
        again = chat_row(client, HIT, case, "hit")  # the last request was another case's
    finally:
        client.close()
    assert again["cached_tokens"] == again["prompt_tokens"]
    assert again["output"] == hits[-1]["output"]
