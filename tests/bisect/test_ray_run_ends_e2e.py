"""A Ray bisect after the `run` that failed (docs/cluster.md, "The ends a failing `run` cached
travel too"), on a REAL local Ray cluster of two nodes whose caches are separate: `run` fills
the driver's cache only, the driver sends seed block 0's ends from it with every node's first
trial, and no node measures them or launches for them.

The head and the other node each start with a `DSV4BISECT_CACHE` of their own (their raylets,
and so their actors, inherit it), the CLI's is a third, as on machines without a shared
filesystem. The question is the issue's scenario on the embedded engine at the ci tier (the
six patches on and double-scale, tests/bisect/test_bisect_e2e.py): the run's candidate drifts
(a WARN at the ci tier, which `--warn-as auto` bisects) and is the bisect's bad end with its
inert patch on (`setup.run_bad_end`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bisect.test_ray_executor import SLOT, engine_pids, run, trials

ray = pytest.importorskip("ray", reason="the Ray executor's tests need `pip install '.[ray]'`")
from ray.cluster_utils import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

QUESTION = ("reference-all", "--tier", "ci", "--set", "engine.precision=exact",
            "--set", "patches.hash-topk-scaling.variant=double-scale")


@pytest.fixture
def separate_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                    ) -> Iterator[tuple[Cluster, list[Path]]]:
    """A head and one more node, one trial slot each, each started with a cache of its own;
    the test process (the CLI's driver and `run`) keeps the one tests/conftest.py gave it."""
    driver = os.environ["DSV4BISECT_CACHE"]
    caches = [tmp_path / "cache-head", tmp_path / "cache-node"]
    monkeypatch.setenv("DSV4BISECT_CACHE", str(caches[0]))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {SLOT: 1}})
    try:
        monkeypatch.setenv("DSV4BISECT_CACHE", str(caches[1]))
        c.add_node(num_cpus=1, resources={SLOT: 1})
        c.wait_for_nodes()
        monkeypatch.setenv("DSV4BISECT_CACHE", driver)
        yield c, caches
    finally:
        c.shutdown()


def test_a_ray_bisect_after_a_failing_run_sends_every_node_the_runs_ends(
        separate_caches: tuple[Cluster, list[Path]], tmp_path: Path) -> None:
    c, caches = separate_caches
    runs = tmp_path  # --out: run directories go under an existing directory
    r = run([sys.executable, "-m", "dsv4bisect", "run", *QUESTION, "--json", "--out",
             str(runs / "run")], timeout=900)
    assert json.loads(r.stdout)["verdict"] in ("FAIL", "WARN"), r.stderr[-4000:]
    driver_cache = Path(os.environ["DSV4BISECT_CACHE"])
    assert list(driver_cache.glob("baselines/candidate-*-b0")), "run cached no candidate"
    out = runs / "bisect"
    r = run([sys.executable, "-m", "dsv4bisect", "bisect", *QUESTION, "--warn-as", "auto",
             "--parallel", "2", "--executor", "ray", "--ray-address", c.address,
             "--set", f"bisect.node_resource={SLOT}", "--json", "--out", str(out)],
            timeout=1400)
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "found" and doc["culprits"] == ["hash-topk-scaling"], doc
    rows = [t for t in trials(out) if t["status"] == "done"]
    # block 0's two ends: the run's, judged on a node with no request and no engine
    ends = [t for t in rows if t["seed_block"] == 0 and t["details"].get("ends_from_run")]
    good = [t for t in ends if not json.loads(t["subset"])]
    bad = [t for t in ends if t["details"].get("bad_end_cached")]
    assert len(good) == 1 and len(bad) == 1, [(t["subset"], t["details"]) for t in rows]
    source = bad[0]["details"]["bad_end_from"]
    assert Path(source).is_relative_to(runs / "run")
    for t in good + bad:
        assert t["details"]["requests"] == 0 and t["details"]["launched_as"] is None
        assert t["details"]["ends_from"]["bad"] == f"run {source}"
        assert not t["details"]["node"].get("replicas") and "ahead" not in t["details"]["node"]
    # no trial measured an end of block 0; every node judged by the run's ends
    assert not any(n.startswith("b0/") for t in rows for n in t["details"]["ends_measured"])
    nodes = {t["details"]["node"]["node_id"] for t in rows}
    assert len(nodes) == 2, "trials did not use both nodes"
    for node in nodes:
        assert any(t["details"]["node"]["node_id"] == node
                   and t["details"]["ends_from"].get("bad") == f"run {source}"
                   and t["details"].get("error_rates") for t in rows), node
    # the driver's ends say which run; neither node's cache holds a block-0 baseline
    run_dir = Path(doc["run_dir"])
    index = json.loads((run_dir / "ends" / "index.json").read_text())
    assert index["from_run"]["0"]["source_run"] == source
    assert index["settled"]["0"]["look"] == 1  # the ci tier: look 1 is the full tier
    for cache in caches:
        assert (cache / "ray-trials").is_dir(), f"{cache}: no node ran there"
        assert not list(cache.glob("baselines/*-b0")), list(cache.glob("baselines/*"))
    table = next(t for t in doc["trials"] if t["ledger_trial"] == bad[0]["id"])
    assert table["bad_end_cached"] is True and table["requests"] == 0
    assert "(bad end cached by a run)" in (run_dir / "report.md").read_text()
    assert not engine_pids(caches[0] / "ray-trials") and not engine_pids(caches[1] / "ray-trials")
