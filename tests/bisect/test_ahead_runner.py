"""The bad end started ahead of the good end's run on a hot runner (HotEngineRunner.ahead, the
Ray executor's `together` rounds and a bad end beside the good end: docs/cluster.md, "Sharded
rows"), on the embedded engine: node B sends the bad end's accuracy requests split across its
engine and a replica on node C before any good end exists, node A measures the good end, B
adopts it through the driver's copy and finishes the probe. The trial is the bad end's normal
trial on one node in every row but timing, judges the same, and measures no baseline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dsv4bisect.bisect.cluster import shared_ends as se
from dsv4bisect.bisect.question import resolve_question
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.hot_runner import HOT_POLICY
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.cli.options import overrides
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.shards import same_content

# full ends: this test is of the probe started ahead, not of the ends' looks
HOT = dataclasses.replace(HOT_POLICY, full_ends=True)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_a_bad_end_started_ahead_on_two_engines_is_its_one_node_trial(tmp_path: Path) -> None:
    q = resolve_question("reference-all", overrides(None, None, None, [
        "engine.precision=exact", "patches.hash-topk-scaling.variant=double-scale"]),
        None, None, "hash-topk-scaling,mhc-bf16")
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)
    bad = spec.patches_for(frozenset(q.candidates))

    def runner():
        return node_runner(RunnerRequest(q.profile, q.good, tuple(q.sets), "ci", False, bad=bad,
                                         load_time=tuple(q.load_time), policy=HOT))

    a, b, c = runner(), runner(), runner()
    driver = se.DriverEnds(tmp_path / "driver")

    def trial_dir(node: str, n: int) -> Path:
        path = tmp_path / node / "bisect" / "trials" / f"t{n}"
        path.mkdir(parents=True)
        return path

    try:
        url = c.replica(dict(bad), trial_dir("node-c", 0))
        ahead_dir = trial_dir("node-b", 1)
        rows = b.ahead(dict(bad), 0, ahead_dir, replicas=[url])
        assert rows > 0
        good_dir = trial_dir("node-a", 2)
        good = a.run(spec.patches_for(frozenset()), 0, good_dir)
        driver.keep(se.pack_ends(a.ends_dir(good_dir), good.details["ends_measured"],
                                 good=a.good_cfg.fingerprint, node="node-a"))
        _sent, archive = driver.pack()
        se.adopt(b, archive, tmp_path / "node-b" / "bisect" / "adopted" / "t1")
        done = b.run(dict(bad), 0, ahead_dir, replicas=[url])
        plain_dir = trial_dir("node-a", 3)
        plain = a.run(dict(bad), 0, plain_dir)  # the same trial on one node
    finally:
        for r in (a, b, c):
            r.close()
            r.stop_all()
    assert done.details["ends_measured"] == ["b0/bad"] and done.details["shards"] == 2
    assert "b0/baseline" not in done.details["ends_measured"]
    assert done.details["ends_from"]["baseline"] == "node-a"
    assert done.verdict == plain.verdict and done.signature == plain.signature
    ran = ProbeRun.load(ahead_dir / "candidate")
    one = ProbeRun.load(plain_dir / "candidate")
    assert same_content(ran, one) == []
    assert ran.shard["count"] == 2 and all(p["rows"] > 0 for p in ran.shard["parts"])
    assert done.requests == plain.requests == len(one.rows)
