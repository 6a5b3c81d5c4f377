"""A Ray node's engine killed while idle is relaunched by the node's runner (issue 40, item 1).

On a REAL local Ray cluster (`ray.cluster_utils.Cluster`), the real `TrialActor` of the Ray
executor holds a node runner across trials, as in a Ray bisect: the same `node_runner`, hence
the same engine pool and its health check (bisect/trials/engine_pool.py). Its embedded engine
is killed from outside between trials by SIGKILL, SIGTERM and SIGHUP in turn; each next trial
relaunches it, says why in its details (`relaunched`), and measures (no CANNOT_TEST). Nothing of
Ray is mocked. Four embedded launches: slow (and Ray is an optional extra CI does not install).
"""

from __future__ import annotations

from dataclasses import replace

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray executor's tests need `pip install '.[ray]'`")
from ray.cluster_utils import Cluster  # noqa: E402

from dsv4bisect.bisect.cluster import remote_trial as rt  # noqa: E402
from dsv4bisect.bisect.cluster.ray_executor import TrialActor  # noqa: E402
from dsv4bisect.bisect.trials.hot_runner import HOT_POLICY  # noqa: E402
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner  # noqa: E402
from dsv4bisect.probe import verdict as V  # noqa: E402
from tests.bisect.test_ray_executor import engine_pids, scratch  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
BAD = {"mhc-bf16": "bf16", "hash-topk-scaling": "double-scale", "mma-decode": "split-k",
       "triton-indexer": "bf16"}


def _kill_leader(root: Path, sig: int) -> int:
    """Send `sig` to the engine process the node runner launched (not its children) and wait
    until it is gone; its pid."""
    pids = engine_pids(root)
    parents = {p: int(Path(f"/proc/{p}/stat").read_text().split()[3]) for p in pids}
    leader = next(p for p, parent in parents.items() if parent not in pids)
    os.kill(leader, sig)
    deadline = time.monotonic() + 60
    while leader in engine_pids(root):
        assert time.monotonic() < deadline, f"the engine ignored {signal.Signals(sig).name}"
        time.sleep(0.1)
    return leader


def test_a_ray_nodes_engine_killed_idle_is_relaunched_by_its_runner(tmp_path: Path) -> None:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        ray.init(address=c.address)
        req = RunnerRequest("reference-all", {}, ("engine.precision=exact",), "ci", False,
                            bad=BAD, policy=replace(HOT_POLICY, full_ends=True))  # --full-ends
        local = node_runner(req)  # the driver's copy: the trials' fingerprints
        actor = ray.remote(TrialActor).options(num_cpus=0, max_restarts=0,
                                               max_concurrency=2).remote(req.to_json(), False)
        node = ray.get(actor.ready.remote())["node"]
        root = scratch() / node["node_id"][:12]

        def trial(patches: dict[str, str], n: int) -> dict[str, Any]:
            cfg = local.config(patches)
            doc = rt.NodeTrial(patches, 0, cfg.fingerprint, cfg.identity, local.probe_hash,
                               "20261206-000000-bisect-idle", f"{n:03d}-trial").to_json()
            reply = ray.get(actor.run.remote(doc), timeout=900)
            assert "error" not in reply, reply
            return dict(reply["result"])

        first = trial({}, 0)  # the good end: its engine launched, measured, kept up
        assert first["details"]["relaunched"] == []
        configs = [BAD, {"mhc-bf16": "bf16"}, {"mma-decode": "split-k"}]
        for n, (sig, patches) in enumerate(zip((signal.SIGKILL, signal.SIGTERM,
                                                signal.SIGHUP), configs), start=1):
            killed = _kill_leader(root, sig)
            result = trial(patches, n)
            why = result["details"]["relaunched"]
            print(f"{signal.Signals(sig).name} (pid {killed}): {result['verdict']}, {why}")
            assert len(why) == 1 and "which dsv4bisect did not send" in why[0], why
            assert result["verdict"] != V.CANNOT_TEST, result
            assert result["details"]["fresh_launch"]  # measured in the relaunched engine
        ray.get(actor.stop.remote())
    finally:
        ray.shutdown()
        c.shutdown()
