"""The null model's arms against the embedded engine's real server (slow): the re-chunked arm
scores every position of a transcript, before its split as the prefix request computed it and
after it from a prefix-cache hit, at the cost of one cold scoring per split."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from dsv4bisect.probe.client import ProbeClient
from dsv4bisect.probe.drift import DriftRecord
from dsv4bisect.probe.null import CONCURRENT_ARM, RECHUNK_ARM
from dsv4bisect.probe.runner import null_arms
from dsv4bisect.probe.spec import tier_spec

from tests.probe.test_e2e_embedded import start_embedded

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = tier_spec("ci")
LENGTHS = (97, 300)  # transcript tokens; scored from position 2 on (start 1), as the probe does


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    # exact: a re-chunk only reorders fp32 sums, so every position's scores must match the
    # cold ones closely; a position scored against the wrong prefix or shifted by one would not
    yield from start_embedded("", "--precision", "exact")


def _cold(client: ProbeClient, case: str, ids: tuple[int, ...]) -> DriftRecord:
    pos, lps, tops = client.score(ids, start=1, top_k=SPEC.drift_top_k)
    return DriftRecord(case, ids, 1, tuple(pos), tuple(lps), tuple(tuple(t) for t in tops))


def test_the_rechunked_arm_scores_every_position_at_one_cold_scoring_per_split(url: str) -> None:
    client = ProbeClient(url, timeout_s=600)
    rng = random.Random(0)
    drift = [_cold(client, f"d{n}", tuple(rng.randrange(10, 500) for _ in range(n)))
             for n in LENGTHS]
    before = client.describe().info
    notes: list[str] = []
    arms = null_arms(client, SPEC, drift, notes)
    after = client.describe().info
    assert not notes
    assert [a for a, _ in arms] == [CONCURRENT_ARM] * 2 + [RECHUNK_ARM] * 6
    rechunked = [r for a, r in arms if a == RECHUNK_ARM]
    splits = []
    for k, cold in enumerate(drift):
        n = len(cold.input_ids)
        for q, rec in zip((1, 2, 3), rechunked[3 * k:3 * k + 3], strict=True):
            split = 1 + (n - 1) * q // 4
            splits.append(split)
            assert rec.case_id == cold.case_id and rec.input_ids == cold.input_ids
            # every scored position but the split's own (the prefix request's output token)
            assert rec.positions == tuple(p for p in cold.positions if p != split)
            at = {p: i for i, p in enumerate(cold.positions)}
            for p, lp, top in zip(rec.positions, rec.token_logprobs, rec.top, strict=True):
                assert lp == pytest.approx(cold.token_logprobs[at[p]], abs=2e-3), p
                assert top[0][0] == cold.top[at[p]][0][0] or \
                    abs(top[0][1] - top[1][1]) < 2e-3, p  # the same top-1 (barring a tie)
    # the cost: each re-chunk prefills the transcript's tokens once (its prefix alone, the
    # rest after a hit on exactly that prefix), as one cold scoring does; the concurrent arm
    # one cold scoring per transcript
    hits = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
    computed = after["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    assert hits == sum(splits)
    assert computed == 4 * sum(n - 1 for n in LENGTHS)
