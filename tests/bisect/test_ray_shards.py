"""A sharded probe on a REAL local Ray cluster (`ray.cluster_utils.Cluster`: a head and two more
nodes, separate raylets, one shard slot on each of the two): each node's actor probes its shard
on an embedded engine server (ci tier, `--precision exact`) and sends it back; the driver merges
(bisect/cluster/ray_executor.py `probe_sharded`, probe/shards.py). The merged run equals the
one-server run in every row but timing; a node's worker killed mid-shard gives its shard to the
other node, whole: the same answer, no request counted twice. Nothing of Ray is mocked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray executor's tests need `pip install '.[ray]'`")
from ray.cluster_utils import Cluster

from dsv4bisect.bisect.cluster.ray_executor import ShardActor, probe_sharded
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import collect
from dsv4bisect.probe.shards import same_content
from dsv4bisect.probe.spec import tier_spec
from tests.probe.test_e2e_embedded import start_embedded

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

SLOT = "shard_slot"
SPEC = tier_spec("ci")


@pytest.fixture(scope="module")
def engines() -> Iterator[list[str]]:
    """One engine per node: two embedded servers on this machine."""
    a, b = start_embedded("", "--precision", "exact"), start_embedded("", "--precision", "exact")
    try:
        yield [next(a), next(b)]
    finally:
        a.close()
        b.close()


@pytest.fixture(scope="module")
def whole(engines: list[str]) -> ProbeRun:
    return collect(engines[0], SPEC)


@pytest.fixture
def actors() -> Iterator[list[Any]]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        c.add_node(num_cpus=1, resources={SLOT: 1})
    c.wait_for_nodes()
    ray.init(address=c.address)
    try:
        cls = ray.remote(num_cpus=0, resources={SLOT: 1}, max_restarts=0,
                         max_task_retries=0)(ShardActor)
        handles = [cls.remote() for _ in range(2)]
        nodes = [ray.get(h.where.remote())["node_id"] for h in handles]
        assert len(set(nodes)) == 2  # one per node
        yield handles
    finally:
        ray.shutdown()
        c.shutdown()


def test_sharded_probe_on_two_nodes_is_the_one_node_run(engines: list[str], whole: ProbeRun,
                                                        actors: list[Any],
                                                        tmp_path: Path) -> None:
    t0 = time.monotonic()
    merged, log = probe_sharded(dict(zip(actors, engines)), SPEC, None, 2, tmp_path)
    wall = time.monotonic() - t0
    assert same_content(merged, whole) == []
    assert sum(p["rows"] for p in merged.shard["parts"]) == len(whole.rows)
    starts = [e for e in log if e[2] == "start"]
    assert len(starts) == 2 and len({e[1] for e in starts}) == 2  # both nodes at once
    print(f"sharded probe on two nodes: {wall:.1f} s; one node: "
          f"{whole.timing['total_s']:.1f} s")


def test_a_worker_killed_mid_shard_gives_its_shard_to_the_other_node(
        engines: list[str], whole: ProbeRun, actors: list[Any], tmp_path: Path) -> None:
    victim = actors[0]
    killer = threading.Timer(3.0, lambda: ray.kill(victim, no_restart=True))
    killer.start()
    try:
        merged, log = probe_sharded(dict(zip(actors, engines)), SPEC, None, 2, tmp_path)
    finally:
        killer.cancel()
    events = [(shard, event) for shard, _, event, _ in log]
    assert events.count((0, "lost")) == 1, log  # the victim held shard 0 when it died
    assert events.count((0, "start")) == 2 and events.count((0, "done")) == 1
    assert events.count((1, "done")) == 1
    rerun = [node for shard, node, event, _ in log if shard == 0 and event == "start"]
    assert rerun[0] != rerun[1]  # re-run on the other node
    assert same_content(merged, whole) == []  # the same answer
    assert sum(p["rows"] for p in merged.shard["parts"]) == len(whole.rows)  # none twice
