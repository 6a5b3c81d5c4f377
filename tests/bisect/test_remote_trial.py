"""What a trial on another node sends back and checks, without a cluster: the archive of the
trial directory, the result's paths moved to the driver, a node's errors naming it, and the
identity check against the driver's resolution (a real `node_runner` on reference-all)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect.bisect.cluster import remote_trial as rt
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.bisect.trials.runner import TrialResult
from dsv4bisect.errors import EngineError
from dsv4bisect.policy import DriftRule, TrialPolicy
from dsv4bisect.probe import verdict as V

NODE = "gpu-07 (10.0.0.7, node 1a2b3c4d)"


def test_archive_round_trip_and_paths_moved_to_the_driver(tmp_path: Path) -> None:
    node_dir = tmp_path / "node" / "bisect" / "trials" / "003-abc-b0-a1"
    (node_dir / "run" / "candidate" / "logs").mkdir(parents=True)
    (node_dir / "run" / "verdict.json").write_text('{"verdict": "FAIL"}\n')
    (node_dir / "run" / "candidate" / "logs" / "server.log").write_text("log\n")
    log = str(node_dir / "run" / "candidate" / "logs" / "server.log")
    result = TrialResult(V.FAIL, signature="drift", duration_s=12.5,
                         details={"run_dir": str(node_dir / "run"),
                                  "other": str(tmp_path / "elsewhere")},
                         throughput=88.0, log_path=log, aa_verdicts=(V.PASS,),
                         error_rates=(0.01, 0.02), requests=40)
    reply = {"result": result.to_json(), "node_dir": str(node_dir),
             "archive": rt.pack(node_dir), "node": {"name": NODE, "started": 1.0,
                                                   "finished": 2.0}}
    driver_dir = tmp_path / "driver" / "trials" / "003-abc-b0-a1"
    got = rt.receive(reply, driver_dir, NODE)
    assert (driver_dir / "run" / "verdict.json").read_text() == '{"verdict": "FAIL"}\n'
    assert got.log_path == str(driver_dir / "run" / "candidate" / "logs" / "server.log")
    assert Path(got.log_path).read_text() == "log\n"
    assert got.details["run_dir"] == str(driver_dir / "run")
    assert got.details["other"] == str(tmp_path / "elsewhere")  # not under the node's dir
    assert got.details["node"]["name"] == NODE
    assert (got.verdict, got.signature, got.aa_verdicts) == (V.FAIL, "drift",
                                                             (V.PASS,))
    # a sequential trial's error rates: the search weighs its verdict with them
    assert (got.error_rates, got.requests) == ((0.01, 0.02), 40)


def test_a_node_error_keeps_its_class_and_hint_and_names_the_node() -> None:
    doc = rt.error_json(EngineError("preflight: `server`: port 30000 held by pid 4 on "
                                    "127.0.0.1", "stop that process"))
    err = rt.node_error(doc, NODE)
    assert isinstance(err, EngineError) and err.exit_code == 125
    assert err.message == f"node {NODE}: preflight: `server`: port 30000 held by pid 4 on " \
                          "127.0.0.1"
    assert err.hint == "stop that process"
    with pytest.raises(EngineError) as raised:  # the driver's side of a reply
        rt.receive({"error": doc}, Path("/nonexistent"), NODE)
    assert raised.value.message == err.message


def test_a_node_that_resolves_another_model_is_refused_naming_it(tmp_path: Path) -> None:
    runner = node_runner(RunnerRequest("reference-all", {}, (), "ci"))
    patches = {"hash-topk-scaling": "double-scale"}
    cfg = runner.config(patches)
    same = rt.NodeTrial(patches, 0, cfg.fingerprint, cfg.identity, runner.probe_hash, "b", "t")
    rt.check_identity(runner, same, NODE)  # the driver's own resolution: accepted
    other = {**cfg.identity, "model": {"model": "another-checkpoint"}}
    driver = rt.NodeTrial(patches, 0, "0123456789abcdef", other, runner.probe_hash, "b", "t")
    with pytest.raises(rt.NodeMismatch) as info:
        rt.check_identity(runner, driver, NODE)
    assert info.value.message.startswith(f"node {NODE} resolves ['hash-topk-scaling'] to "
                                         f"fingerprint {cfg.fingerprint}, the driver to "
                                         "0123456789abcdef (differs: model)")
    reply = rt.run_on_node(runner, driver, tmp_path, {"name": NODE})
    assert reply["error"]["class"] == "NodeMismatch" and not any(tmp_path.iterdir())


def test_a_verdict_judged_against_the_two_ends_is_keyed_by_the_bad_end_too() -> None:
    """A trial whose drift is judged relative to the ends measures something else in a bisect
    with another bad end: its ledger key differs, so no other bisect's verdict is reused."""
    def probe_hash(bad: dict[str, str], drift: str) -> str:
        policy = TrialPolicy(drift=DriftRule(drift), hot=True, sequential=True)
        return node_runner(RunnerRequest("reference-all", {}, (), "ci", bad=bad,
                                         policy=policy)).probe_hash

    double = {"hash-topk-scaling": "double-scale"}
    merge = {"mma-decode": "merge-no-rescale"}
    assert probe_hash(double, "relative") != probe_hash(merge, "relative")
    assert probe_hash(double, "relative") == probe_hash(dict(double), "relative")
    assert probe_hash(double, "absolute") == probe_hash(merge, "absolute")
