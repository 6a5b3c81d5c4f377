"""A probe split across two replicas of one configuration, on the embedded engine's real HTTP
servers (ci tier, random tiny weights, `--precision exact`): the merged shards are the one-server
run in every row but timing, and judge the same; a sequential trial dealt to two replicas draws,
decides and stops as on one (probe/shards.py, probe/sequential_run.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace

import pytest

from dsv4bisect.probe.run import ProbeRun, row_key
from dsv4bisect.probe.runner import collect, collect_sharded, judge
from dsv4bisect.probe.sequential import ends_from_runs
from dsv4bisect.probe.sequential_run import run_sequential
from dsv4bisect.probe.shards import Shard, merge, same_content
from dsv4bisect.probe.spec import tier_spec
from tests.probe.test_e2e_embedded import start_embedded

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

SPEC = tier_spec("ci")
FAULT = "hash-topk-scaling:double-scale"


@pytest.fixture(scope="module")
def replica_a() -> Iterator[str]:
    yield from start_embedded("", "--precision", "exact")


@pytest.fixture(scope="module")
def replica_b() -> Iterator[str]:
    yield from start_embedded("", "--precision", "exact")


@pytest.fixture(scope="module")
def whole(replica_a: str) -> ProbeRun:
    return collect(replica_a, SPEC)


def _shards(urls: list[str], reference: ProbeRun | None = None) -> ProbeRun:
    return merge([collect(u, SPEC, reference_run=reference, shard=Shard(i, len(urls)))
                  for i, u in enumerate(urls)])


def test_merged_shards_are_the_one_server_run(whole: ProbeRun, replica_a: str,
                                              replica_b: str) -> None:
    merged = _shards([replica_a, replica_b])
    assert same_content(merged, whole) == []
    assert len(merged.rows) == len(whole.rows) and merged.shard["count"] == 2
    assert {p["url"] for p in merged.shard["parts"]} == {replica_a, replica_b}
    assert all(p["rows"] > 0 for p in merged.shard["parts"])
    # as a candidate replaying the baseline: the same rows, the same verdict
    one = collect(replica_a, SPEC, reference_run=whole)
    two = _shards([replica_b, replica_a], reference=whole)
    assert same_content(two, one) == []
    verdicts = [{k: v for k, v in judge(whole, None, run).to_dict().items()
                 if k != "throughput"} for run in (two, one)]  # throughput: timing
    assert verdicts[0] == verdicts[1]


def test_a_sequential_trial_on_two_replicas_decides_as_on_one(whole: ProbeRun, replica_a: str,
                                                              replica_b: str) -> None:
    bad_url = start_embedded(FAULT, "--precision", "exact")
    url = next(bad_url)
    try:
        bad = collect(url, SPEC, reference_run=whole)
        repeat = collect(replica_a, SPEC, reference_run=whole)
        for trial in (replica_a, url):  # like the good end, like the bad end
            one = run_sequential(trial, whole, bad, repeat, false_fail=0.05, false_pass=0.05)
            urls = [trial, replica_b] if trial == replica_a else [url, url]
            two = run_sequential(urls, whole, bad, repeat, false_fail=0.05, false_pass=0.05)
            assert two.decision.to_dict() == one.decision.to_dict()
            assert same_content(two.run, one.run) == []
            assert two.run.shard is not None and sum(
                p["rows"] for p in two.run.shard["parts"]) == len(one.run.rows)
    finally:
        bad_url.close()


def test_shards_of_a_concurrent_level_are_the_one_server_run(replica_a: str,
                                                             replica_b: str) -> None:
    """At a concurrency level above 1 each shard sends its requests in the whole level's
    submission order; at `precision: exact` a request's answer does not depend on its batch
    mates, so the merge is again the one-server run."""
    spec = replace(SPEC, concurrency=(1, 4), arms=("cold", "warm"))
    whole = collect(replica_a, spec)
    merged = merge([collect(u, spec, shard=Shard(i, 2))
                    for i, u in enumerate([replica_a, replica_b])])
    assert same_content(merged, whole) == []
    assert {r["concurrency"] for r in merged.rows} == {1, 4}
    assert set(merged.throughput) == {"1", "4"} and merged.throughput["4"]["shards"] == 2


def test_collect_sharded_re_runs_a_lost_replicas_shard_on_its_own_engine(
        whole: ProbeRun, replica_a: str) -> None:
    """The hot runner's sharded probe (probe/runner.py `collect_sharded`): a replica that does
    not answer (its node gone: nothing listens at its url) gives its shard back; it is re-run
    whole on the caller's engine, and the merge is still the one-server run, no request twice."""
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}"
    merged = collect_sharded([replica_a, gone], SPEC)
    assert same_content(merged, whole) == []
    assert [p["url"] for p in merged.shard["parts"]] == [replica_a, replica_a]
    assert sum(p["rows"] for p in merged.shard["parts"]) == len(whole.rows)


def test_a_sequential_trial_sends_concurrency_groups_whole(replica_a: str,
                                                           replica_b: str) -> None:
    """A trial replays a level-4 request with its concurrency group, on one server or dealt
    over two replicas (a group goes whole to one), and decides the same either way. The ends
    are the real run with its answers re-marked (random weights retrieve nothing): the good
    end right everywhere, the bad end wrong at concurrency 4 only, so the groups carry the
    evidence and the trial must send them (both arms at both levels: 8 requests at 4, two
    groups, enough for the ends to differ)."""
    spec = replace(SPEC, concurrency=(1, 4), arms=("cold", "warm"), arm_plan="every")
    run = collect(replica_a, spec)

    def marked(right) -> ProbeRun:
        return replace(run, rows=tuple(r if r["arm"] == "drift" else {**r, "correct": right(r)}
                                       for r in run.rows))

    good, bad = marked(lambda r: True), marked(lambda r: r["concurrency"] == 1)
    one = run_sequential(replica_a, good, bad, good, false_fail=0.05, false_pass=0.05)
    two = run_sequential([replica_a, replica_b], good, bad, good, false_fail=0.05,
                         false_pass=0.05)
    assert two.decision.to_dict() == one.decision.to_dict()
    assert one.verdict == "FAIL" and one.decision.decided_by == "accuracy"
    group_of = {c.key: c.group for c in ends_from_runs(good, bad, good).cases
                if c.concurrency == 4}
    at4 = [row_key(r) for r in one.run.rows if r["concurrency"] == 4]
    touched = {group_of[k] for k in at4}
    assert at4 and sorted(at4) == sorted(k for k, g in group_of.items() if g in touched)
    assert sum(p["rows"] for p in two.run.shard["parts"]) == len(two.run.rows)
