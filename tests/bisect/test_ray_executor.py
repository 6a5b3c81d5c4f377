"""`bisect --executor ray` on a REAL local Ray cluster: a head and one more node started by the
test (`ray.cluster_utils.Cluster`, separate raylets), each offering one unit of the custom
resource `trial_slot`, so each trial slot holds a "node"; the embedded engine at the ci tier is
the engine. Nothing of Ray is mocked. The driver is the CLI in its own process, as a user runs
it. Engines are found by the receipts directory in their environment, which for a node's trial
lies under that node's scratch root (`$DSV4BISECT_CACHE/ray-trials/<node>/`).

The end-to-end cases launch 6-10 embedded engines each (a minute or more on the 2-core CPU)
and are `slow`; so is the preflight case, which launches nothing: CI does not install Ray.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray executor's tests need `pip install '.[ray]'`")
from ray.cluster_utils import Cluster

SLOT = "trial_slot"
# The e2e tests' questions (tests/bisect/test_bisect_e2e.py), on the fp32 path their cases were
# written for. Hot runners judge drift relative to the two ends (docs/bisect.md, "Drift and
# WARN"), so theirs is the fault that only drifts (a WARN at the ci tier, which `--warn-as auto`
# counts as the bad end's own). Fresh launches judge drift against the run's gates, where at
# `exact` every kernel patch drifts beyond the null: theirs is a question that loses facts, the
# test-only canary pair (DSV4BISECT_TEST_PATCHES=1, set for the nodes too). --fresh-launches:
# these tests compare the executors trial for trial, and a local bisect of rounds of 2 launches
# fresh; the hot runners on the nodes and the ends they share have their own tests
# (docs/cluster.md).
SINGLE = ("--tier", "ci", "--set", "engine.precision=exact",
          "--set", "patches.hash-topk-scaling.variant=double-scale",
          "--candidates", "mhc-bf16,hash-topk-scaling,mma-decode,triton-indexer",
          "--warn-as", "auto", "--parallel", "2")
CULPRIT = ["hash-topk-scaling"]
PAIR = ("--tier", "ci", "--set", "engine.precision=exact", "--fresh-launches",
        "--bad", "canary-a,canary-b,hash-topk-scaling,triton-indexer:fp32", "--parallel", "2")
PAIR_CULPRITS = ["canary-a", "canary-b"]


@pytest.fixture(autouse=True)
def test_patches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The canary pair registered here and on the nodes (their raylets inherit this env)."""
    monkeypatch.setenv("DSV4BISECT_TEST_PATCHES", "1")


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, Any]]:
    """A head and one more node, one trial slot each; their raylets inherit this test's
    DSV4BISECT_CACHE (tests/conftest.py), so their scratch roots are the test's."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {SLOT: 1}})
    other = c.add_node(num_cpus=1, resources={SLOT: 1})
    c.wait_for_nodes()
    try:
        yield c, other
    finally:
        c.shutdown()


def scratch() -> Path:
    return Path(os.environ["DSV4BISECT_CACHE"]) / "ray-trials"


def argv(c: Cluster, out: Path, *args: str, executor: str = "ray",
         question: tuple[str, ...] = PAIR) -> list[str]:
    ray_args = ("--executor", "ray", "--ray-address", c.address,
                "--set", f"bisect.node_resource={SLOT}") if executor == "ray" else ()
    return [sys.executable, "-m", "dsv4bisect", "bisect", *question, *ray_args, *args, "--json",
            "--out", str(out)]


def hot_argv(c: Cluster, out: Path, *args: str) -> list[str]:
    """`argv` with hot runners, on the question that only drifts (see SINGLE)."""
    return argv(c, out, *args, question=SINGLE)


def run(cmd: list[str], timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env={**os.environ, "NO_COLOR": "1"}, capture_output=True,
                          text=True, timeout=timeout, check=False)


def start(cmd: list[str], log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, env={**os.environ, "NO_COLOR": "1"}, text=True,
                            stdout=subprocess.PIPE, stderr=log.open("w"))


def engine_pids(root: Path) -> set[int]:
    """Live processes whose receipts directory lies under `root`."""
    marker = f"DSV4BISECT_RECEIPTS={root.resolve()}/".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes() and \
                    (entry / "stat").read_text().split()[2] != "Z":
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def trials(out: Path) -> list[dict[str, Any]]:
    path = out / "ledger.sqlite"
    if not path.exists():
        return []
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        try:
            rows = [dict(r) for r in conn.execute("SELECT * FROM trials ORDER BY id")]
        except sqlite3.OperationalError:  # not created yet
            return []
    for r in rows:
        r["details"] = json.loads(r["details"]) if r.get("details") else {}
    return rows


# slow, though it launches no engine: Ray is an optional extra that CI's install (the README's
# test command) leaves out, and the test starts a two-node Ray cluster; the slow suite runs it
@pytest.mark.slow
def test_a_node_without_a_free_port_fails_like_a_local_preflight_naming_it(
        cluster: tuple[Cluster, Any], tmp_path: Path) -> None:
    c, _ = cluster
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = run(argv(c, tmp_path / "runs", "--set", f"engine.port={port}"), timeout=300)
    assert r.returncode == 125, r.stderr
    error = next(line for line in r.stderr.splitlines() if line.startswith("error:"))
    assert error.startswith("error: node ") and "): preflight: `server`: " in error, error
    assert str(port) in error
    assert not list((tmp_path / "runs").glob("*bisect*")), "a run directory was written"


@pytest.mark.slow  # two bisects of 7 embedded launches each, 2-3 minutes on the 2-core CPU
def test_ray_parallel_bisect_names_the_local_culprit_with_trials_on_two_nodes_at_once(
        cluster: tuple[Cluster, Any], tmp_path: Path) -> None:
    c, _ = cluster
    t0 = time.monotonic()
    local = run(argv(c, tmp_path / "local", executor="local"))
    t_local = time.monotonic() - t0
    assert local.returncode == 0, local.stderr
    t0 = time.monotonic()
    r = run(argv(c, tmp_path / "ray"))
    t_ray = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    report, expected = json.loads(r.stdout), json.loads(local.stdout)
    print(f"local --parallel 2: {t_local:.0f} s; ray --parallel 2: {t_ray:.0f} s")
    assert report["culprits"] == expected["culprits"] == PAIR_CULPRITS
    assert [t["subset"] for t in report["trials"]] == [t["subset"] for t in expected["trials"]]
    rows = [t for t in trials(tmp_path / "ray") if t["status"] == "done"]
    nodes = {t["details"]["node"]["node_id"] for t in rows}
    assert len(nodes) == 2, "trials did not use both nodes"
    at_once = [(a["step"], b["step"]) for a in rows for b in rows if a["id"] < b["id"]
               and b["started"] < a["finished"]
               and a["details"]["node"]["node_id"] != b["details"]["node"]["node_id"]
               and b["details"]["node"]["started"] < a["details"]["node"]["finished"]]
    assert at_once, "no two trials ran at the same time on different nodes"
    for t in report["trials"]:  # what each node sent back is in the driver's run directory
        run_dir = Path(t["trial_run_dir"])
        assert str(run_dir).startswith(str(tmp_path / "ray"))
        assert json.loads((run_dir / "verdict.json").read_text())["verdict"] == t["verdict"]
    assert not engine_pids(scratch())


@pytest.mark.slow  # a hot bisect on two nodes: about 6 embedded launches, 2-3 minutes
def test_a_hot_ray_bisect_shares_the_ends_so_nodes_probe_with_ends_they_did_not_measure(
        cluster: tuple[Cluster, Any], tmp_path: Path) -> None:
    c, _ = cluster
    out = tmp_path / "ray"
    # --no-shard: each trial on a node of its own, so the first round runs both ends at once
    # (sharded, the ends run one after the other, each on every node: the next test)
    hot = hot_argv(c, out, "--no-shard")
    r = run(hot)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["culprits"] == CULPRIT
    rows = [t for t in trials(out) if t["status"] == "done"]
    assert {t["details"]["mode"] for t in rows} == {"hot"}
    # the ends came back to the driver's run directory, each with the node that measured it
    run_dir = next(out.glob("*-bisect-*"))
    index = json.loads((run_dir / "ends" / "index.json").read_text())
    # (the ends in two looks; on the ci tier look 1 is the whole tier: it settles the block)
    assert {"b0/look1/baseline", "b0/look1/baseline-repeat", "b0/look1/bad"} <= set(index["ends"])
    assert (run_dir / "ends" / "b0" / "look1" / "bad" / "run.json").is_file()
    assert index["settled"]["0"]["look"] == 1
    # a trial probed sequentially on a node that never ran the bad end: judged against the ends
    # another node measured
    adopted = [t for t in rows if t["details"].get("error_rates")
               and t["details"]["ends_from"].get("bad") not in (None, t["details"]["node"]["name"])]
    assert adopted, [(t["step"], t["seed_block"], t["details"]["node"]["node_id"][:8],
                      t["details"].get("error_rates"), t["details"]["ends_from"],
                      t["details"]["ends_measured"]) for t in rows]
    # no node measured a good end another node had measured before its trial started: block 0's
    # baseline at most once per node, in the first round
    measured = [t for t in rows if "b0/look1/baseline" in t["details"]["ends_measured"]]
    assert len({t["details"]["node"]["node_id"] for t in measured}) == len(measured) <= 2
    # the first round measured both ends at once on different nodes; the report says which
    # node measured what, and when (--json: trials[].node; markdown: "on NODE, start-end")
    doc = json.loads(r.stdout)
    good = next(t for t in doc["trials"] if not t["subset"])
    bad = next(t for t in doc["trials"] if len(t["subset"]) == 4)
    assert good["node"]["node_id"] != bad["node"]["node_id"]
    assert max(good["node"]["started"], bad["node"]["started"]) < min(
        good["node"]["finished"], bad["node"]["finished"])
    assert f"node {good['node']['node_id'][:8]}), " in (run_dir / "report.md").read_text()
    # the bad end's node started its probe ahead of the good end's run (its accuracy
    # requests), finished it once that run was back, and measured no baseline of its own
    # (probe/ahead.py; the node plan prices this round so)
    ahead = bad["node"]["ahead"]
    assert ahead["rows"] > 0 and ahead["started"] < good["node"]["finished"]
    assert ahead["resumed"] >= good["node"]["finished"]
    first_bad = next(t for t in rows if "b0/look1/bad" in t["details"]["ends_measured"])
    assert first_bad["details"]["node"]["node_id"] == bad["node"]["node_id"]
    assert "b0/look1/baseline" not in first_bad["details"]["ends_measured"]
    assert "started ahead of the good end (" in (run_dir / "report.md").read_text()
    assert not engine_pids(scratch())


@pytest.mark.slow  # two hot bisects on two nodes, with and without sharding: 4-6 minutes
def test_a_ray_bisect_on_two_nodes_with_sharded_probes_names_the_culprit_found_without(
        cluster: tuple[Cluster, Any], tmp_path: Path) -> None:
    """--parallel 2 (sharding on): the ends one after the other, each alone in its round and
    its probe split across both nodes; every other trial on a node of its own (bisect/rounds.py:
    the schedule the node plan prices). The same bisect with --no-shard (both ends at once, a
    trial per node) names the same culprit. Both measure their ends (--no-cache)."""
    c, _ = cluster

    def hot(out: Path, *args: str) -> list[str]:
        return hot_argv(c, out, "--no-cache", *args)

    t0 = time.monotonic()
    r = run(hot(tmp_path / "sharded"))
    t_sharded = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    plain = run(hot(tmp_path / "plain", "--no-shard"))
    t_plain = time.monotonic() - t0
    assert plain.returncode == 0, plain.stderr
    doc, base = json.loads(r.stdout), json.loads(plain.stdout)
    assert doc["culprits"] == base["culprits"] == CULPRIT
    print(f"hot ray, 2 nodes, --parallel 2: sharded ends {t_sharded:.0f} s; --no-shard "
          f"{t_plain:.0f} s; load {os.getloadavg()[0]:.1f}")
    # the ends: each probed on both nodes, its own and a replica switched to its
    # configuration, the good end before the bad end (report and --json: which node measured
    # what, and when)
    everything = 4
    ends = [t for t in doc["trials"] if len(t["subset"]) in (0, everything)]
    good = next(t for t in ends if not t["subset"])
    bad = next(t for t in ends if t["subset"])
    for t in (good, bad):
        node = t["node"]
        assert [r["node_id"] for r in node.get("replicas", [])] != [], doc["trials"]
        replica = node["replicas"][0]
        assert replica["node_id"] != node["node_id"]
        # the replica's engine ready (just before the trial starts on its node) until the end
        assert replica["started"] <= node["finished"] <= replica["finished"]
    assert good["node"]["finished"] <= bad["node"]["started"]
    # every other trial on one node, no replica; a round of two runs them at once
    others = [t for t in doc["trials"] if t not in ends]
    assert others and all(not t["node"].get("replicas") for t in others)
    assert all(not t["node"].get("replicas") for t in base["trials"])
    # the good end's baseline was measured once, sharded, on both nodes; the ends' runs hold
    # both shards, merged
    run_dir = next((tmp_path / "sharded").glob("*-bisect-*"))
    for end in ("baseline", "baseline-repeat", "bad"):
        shard = json.loads((run_dir / "ends" / "b0" / "look1" / end / "run.json").read_text()
                           )["shard"]
        assert shard["count"] == 2 and all(p["rows"] > 0 for p in shard["parts"]), end
    verdicts = {tuple(sorted(t["subset"])): t["verdict"] for t in base["trials"]}
    for t in doc["trials"]:  # the configurations both ran: the same verdicts
        assert verdicts.get(tuple(sorted(t["subset"])), t["verdict"]) == t["verdict"]
    assert "probe sharded + " in (run_dir / "report.md").read_text()
    assert not engine_pids(scratch())


def kill_actor_worker(node_root: Path) -> None:
    """SIGKILL the Ray worker process that launched the engines recorded under `node_root`
    (the owner in their engines.json)."""
    record = wait_for(lambda: next(node_root.glob("*/trials/*/*/*/engines.json"), None), 60,
                      "the engines' record")
    os.kill(int(json.loads(record.read_text())["owner"]["pid"]), signal.SIGKILL)


@pytest.mark.slow  # about 8 embedded launches and a lost node or worker: 2-3 minutes each
@pytest.mark.parametrize("what", ["raylet", "worker"])
def test_a_node_lost_mid_trial_makes_it_cannot_test_rerun_to_the_same_answer(
        cluster: tuple[Cluster, Any], tmp_path: Path, what: str) -> None:
    c, other = cluster
    out = tmp_path / "runs"
    proc = start(argv(c, out), tmp_path / "stderr.txt")
    node_root = scratch() / other.node_id[:12]
    try:  # the other node's engine is up: its trial is in flight
        wait_for(lambda: engine_pids(node_root), 300, "an engine on the second node")
        if what == "raylet":
            other.kill_raylet()
        else:
            kill_actor_worker(node_root)
        stdout, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 0, stderr
    report = json.loads(stdout)
    assert report["culprits"] == PAIR_CULPRITS
    rows = trials(out)
    lost = [t for t in rows if t["verdict"] == "CANNOT_TEST"]
    assert lost and all(t["signature"].startswith("node-lost: ") for t in lost), rows
    assert other.node_id[:8] in lost[0]["signature"]
    for t in lost:  # re-run to a verdict (after a lost raylet, on the node that is left)
        again = [u for u in rows if u["fingerprint"] == t["fingerprint"] and u["id"] > t["id"]
                 and u["seed_block"] == t["seed_block"]]
        assert again and again[-1]["status"] == "done" and again[-1]["verdict"] != "CANNOT_TEST"
        if what == "raylet":
            assert again[-1]["details"]["node"]["node_id"] != other.node_id
    wait_for(lambda: not engine_pids(scratch()), 60, "the lost node's engines to be stopped")


@pytest.mark.slow  # a killed driver, its resume: about 9 embedded launches, 2-3 minutes each
@pytest.mark.parametrize("mode", ["fresh", "hot"])
def test_kill_9_of_the_driver_leaves_no_engine_and_resume_repeats_no_finished_trial(
        cluster: tuple[Cluster, Any], tmp_path: Path, mode: str) -> None:
    c, _ = cluster
    out = tmp_path / "runs"
    cmd = argv(c, out) if mode == "fresh" else hot_argv(c, out)
    proc = start(cmd, tmp_path / "stderr.txt")
    try:
        # a trial running too: killed in the gap between two rounds (the search choosing
        # the next), the driver leaves none to abandon
        def killable() -> bool:
            status = [t["status"] for t in trials(out)]
            return (status.count("done") >= 2 and "running" in status
                    and bool(engine_pids(scratch())))

        wait_for(killable, 400, "two finished trials, one running and engines up")
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_for(lambda: not engine_pids(scratch()), 90, "the nodes to stop the killed driver's engines")
    finished = {(t["fingerprint"], t["seed_block"]) for t in trials(out) if t["status"] == "done"}
    before = max(t["id"] for t in trials(out))
    run_dir = next(out.glob("*-bisect-*"))
    index = run_dir / "ends" / "index.json"
    kept = set(json.loads(index.read_text())["ends"]) if index.exists() else set()
    assert bool(kept) == (mode == "hot")  # the finished trials' ends are the driver's
    r = run([sys.executable, "-m", "dsv4bisect", "bisect", "--resume", str(run_dir), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["culprits"] == (PAIR_CULPRITS if mode == "fresh" else CULPRIT)
    rows = trials(out)
    for t in rows:  # the resumed bisect's nodes were sent the ends kept: none measured again
        if t["id"] > before and t["status"] == "done":
            assert not kept & set(t["details"].get("ends_measured") or ()), t
    for key in finished:
        runs = [t for t in rows if (t["fingerprint"], t["seed_block"]) == key
                and t["status"] == "done"]
        assert len(runs) == 1, f"finished trial {key} ran again"
    assert any(t["status"] == "abandoned" for t in rows)  # the interrupted ones ran again
    wait_for(lambda: not engine_pids(scratch()), 60, "no engine after the resume")


@pytest.mark.slow  # one or two embedded launches, then Ctrl-C: about a minute
def test_ctrl_c_stops_every_actor_and_its_engines(cluster: tuple[Cluster, Any],
                                                   tmp_path: Path) -> None:
    c, _ = cluster
    out = tmp_path / "runs"
    proc = start(argv(c, out), tmp_path / "stderr.txt")
    try:
        wait_for(lambda: len({p for p in engine_pids(scratch())}) >= 2, 300,
                 "engines up on the nodes")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 130, stderr
    assert "dsv4bisect bisect --resume" in stderr
    wait_for(lambda: not engine_pids(scratch()), 30, "the engines to be stopped")
    assert all(t["status"] != "running" for t in trials(out))


# The ends' two looks (bisect/end_looks.py) on the smoke tier, where look 1 is a quarter of the
# accuracy cases: the bad end of this question loses facts at look 1 on the local runner
# (tests/bisect/test_end_looks_e2e.py), so its block settles there.
LOOKS = ("--tier", "smoke", "--set", "patches.fp8-wo-a-gemm.variant=scale-layout",
         "--parallel", "2")


@pytest.mark.slow  # a hot smoke-tier bisect on two nodes: about 10 minutes on the 2-core CPU
@pytest.mark.timeout(3000)
def test_a_ray_bisect_settles_its_ends_at_look_1_and_every_node_judges_with_that_look(
        cluster: tuple[Cluster, Any], tmp_path: Path) -> None:
    """The ends' looks travel (docs/cluster.md, "The ends travel"): the bad end's node settles
    seed block 0 at look 1 and sends its look-1 run with the settled look; the other node
    adopts them and judges its trials with look 1's spec, probing neither end again."""
    from dsv4bisect.bisect.end_looks import LOOK1_MAX_SHARE

    c, _ = cluster
    out = tmp_path / "ray"
    r = run(argv(c, out, question=LOOKS), timeout=2900)
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "found" and doc["culprits"] == ["fp8-wo-a-gemm"], doc
    rows = [t for t in trials(out) if t["status"] == "done"]
    (bad,) = [t for t in rows if "end_look" in t["details"] and t["seed_block"] == 0]
    assert bad["verdict"] == "FAIL" and bad["details"]["end_look"] == 1
    assert bad["details"]["settled_by"] in ("accuracy", "signatures", "other")
    run_dir = next(out.glob("*-bisect-*"))
    index = json.loads((run_dir / "ends" / "index.json").read_text())
    assert index["settled"]["0"]["look"] == 1
    assert "b0/look1/bad" in index["ends"] and not any("look2" in n for n in index["ends"])
    # no node probed look 2, or an end another node had measured
    measured = [n for t in rows for n in t["details"].get("ends_measured") or ()]
    assert not any("look2" in n for n in measured)
    assert measured.count("b0/look1/bad") == 1
    # a trial on the other node, judged against ends it adopted, at look 1's spec
    bad_node = bad["details"]["node"]["node_id"]
    adopted = [t for t in rows if t["details"]["node"]["node_id"] != bad_node
               and t["details"]["ends_from"].get("bad") and t["details"].get("error_rates")]
    assert adopted, [(t["step"], t["details"]["node"]["node_id"][:8],
                      t["details"]["ends_from"]) for t in rows]
    for t in adopted:
        cand = json.loads((Path(t["details"]["run_dir"]) / "candidate" / "run.json"
                           ).read_text())
        assert cand["spec"]["case_share"] == LOOK1_MAX_SHARE
    assert not engine_pids(scratch())


@pytest.fixture
def cluster3() -> Iterator[Cluster]:
    """A head and two more nodes, one trial slot each (as `cluster`)."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {SLOT: 1}})
    for _ in range(2):
        c.add_node(num_cpus=1, resources={SLOT: 1})
    c.wait_for_nodes()
    try:
        yield c
    finally:
        c.shutdown()


@pytest.mark.slow  # a hot bisect on three nodes: about 7 embedded launches, 3-5 minutes
@pytest.mark.timeout(1800)
def test_trials_beside_the_ends_start_with_them_on_nodes_of_their_own(
        cluster3: Cluster, tmp_path: Path) -> None:
    """`bisect.ends=beside` (bisect/rounds.py BESIDE, docs/cluster.md "Trials beside the
    ends"): the first round runs each end on one node, unsharded, and the search's first trial
    on the third; that trial launches and sends its requests while the good end runs, as the
    bad end does, is judged against the good end's run (no baseline of its own), and the
    bisect names the culprit the other schedules name."""
    out = tmp_path / "ray"
    r = run(argv(cluster3, out, "--no-cache", "--set", "bisect.ends=beside",
                 question=(*SINGLE[:-1], "3")))
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads(r.stdout)
    assert doc["culprits"] == CULPRIT
    first = sorted(doc["trials"], key=lambda t: t["step"])[:3]
    good, bad, beside = first
    assert not good["subset"] and len(bad["subset"]) == 4
    assert 0 < len(beside["subset"]) < 4, first
    assert len({t["node"]["node_id"] for t in first}) == 3
    for t in first:  # unsharded: no replica serves an end
        assert not t["node"].get("replicas"), t["node"]
    # both the bad end and the trial beside it started ahead of the good end's run and
    # finished once it was back
    for t in (bad, beside):
        ahead = t["node"]["ahead"]
        assert ahead["rows"] > 0 and ahead["started"] < good["node"]["finished"], t["node"]
        assert ahead["resumed"] >= good["node"]["finished"]
    rows = {t["step"]: t for t in trials(out) if t["status"] == "done"}
    side = next(t for t in rows.values() if t["step"] == beside["step"])
    assert not any("baseline" in n for n in side["details"]["ends_measured"]), side["details"]
    assert side["details"]["ends_from"].get("baseline") == good["node"]["name"]
    assert not engine_pids(scratch())
