"""`dsv4bisect run` and `dsv4bisect report` end to end, with real engine processes on this CPU.

The shipped `reference` profiles use random tiny weights: the accuracy families carry no evidence
and drift decides (the verdict must say so). One baseline cache is shared by this module, so the
later runs show the cache at work while their candidates still get their own engines.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from run_helpers import (
    FAULT_SERVER,
    SERVE_ARGS,
    cli,
    command_profile,
    fault_profile,
    load,
    only_run_dir,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("run-cache")


def _ready_port(log: Path) -> str:
    line = next(x for x in log.read_text().splitlines() if "ready: dsv4bisect reference" in x)
    return line.split("http://127.0.0.1:")[1].split()[0]


def test_reference_launches_the_candidate_separately_and_passes(tmp_path: Path,
                                                                  cache: Path) -> None:
    runs = tmp_path / "runs"
    r = cli("run", "reference", "--tier", "ci", "--out", runs, "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    verdict = load_json(r.stdout)
    assert verdict["verdict"] == "PASS" and verdict["drift"]["status"] == "pass"
    assert any("no evidence" in x and "drift decides" in x for x in verdict["reasons"])
    run_dir = only_run_dir(runs)
    doc = load(run_dir / "run.json")
    arms = doc["arms"]
    # Same fingerprint at both ends, yet two launches: the candidate has its own engine.
    assert arms["baseline"]["fingerprint"] == arms["candidate"]["fingerprint"]
    assert arms["baseline"]["attempts"] == 1 and arms["candidate"]["attempts"] == 1
    assert _ready_port(run_dir / "baseline/logs/server.log") != _ready_port(
        run_dir / "candidate/logs/server.log")
    assert doc["status"] == "done" and doc["verdict"] == "PASS" and doc["wall_s"] > 0
    for name in ("verdict.json", "report.md", "heatmap.png", "baseline/config.json",
                 "baseline/rows.jsonl", "baseline-repeat/rows.jsonl", "candidate/config.json",
                 "candidate/rows.jsonl", "candidate/drift.jsonl", "candidate/receipts"):
        assert (run_dir / name).exists(), name
    assert load(run_dir / "verdict.json") == verdict
    assert "PASS" in r.stderr and "run dir:" in r.stderr  # the summary goes to stderr

    again = cli("report", run_dir, "--json", cache=cache)
    assert again.returncode == 0 and load_json(again.stdout) == verdict
    md = cli("report", run_dir, "--format", "md", cache=cache)
    assert md.stdout == (run_dir / "report.md").read_text()
    assert "# dsv4bisect run: PASS" in md.stdout and "## Drift (teacher-forced)" in md.stdout
    term = cli("report", run_dir, cache=cache)
    assert term.stdout.startswith("PASS  reference (ci tier")


def test_a_cached_baseline_is_reused_and_the_candidate_still_launches(tmp_path: Path,
                                                                      cache: Path) -> None:
    runs = tmp_path / "runs"
    r = cli("run", "reference", "--tier", "ci", "--out", runs, cache=cache)
    assert r.returncode == 0, r.stderr
    arms = load(only_run_dir(runs) / "run.json")["arms"]
    assert arms["baseline"]["cached"] is not None and arms["baseline"]["attempts"] == 0
    assert arms["candidate"]["attempts"] == 1
    assert "baseline reused from the cache" in r.stderr


def test_double_scale_fault_warns_on_drift_alone(tmp_path: Path, cache: Path) -> None:
    # no fact lost (the ci tier's families carry no evidence): drift alone is a WARN, which
    # exits 0 by default, so `git bisect run dsv4bisect run` lands on a commit that loses facts
    runs = tmp_path / "runs"
    r = cli("run", "reference", "--tier", "ci", "--out", runs, "--json",
            "--set", "patches.hash-topk-scaling.variant=double-scale", cache=cache)
    assert r.returncode == 0, r.stderr
    v = load_json(r.stdout)
    assert v["verdict"] == "WARN" and v["drift"]["status"] == "warn"
    assert any(reason.startswith("drift WARN") for reason in v["reasons"]), v["reasons"]
    assert v["drift"]["candidate"]["top1_agreement"] < 0.9
    assert not any(f["evidence"] for f in v["families"].values())
    doc = load(only_run_dir(runs) / "run.json")
    assert doc["arms"]["candidate"]["patch_set"] == {"hash-topk-scaling": "double-scale"}
    assert doc["arms"]["candidate"]["faults"] == ["hash-topk-scaling"]
    assert doc["arms"]["baseline"]["patch_set"] == {}
    # issue 41: report.md says the exit the process had, and the terminal the next step
    md = (only_run_dir(runs) / "report.md").read_text()
    assert ("- exit 0 (a drift WARN under `--warn-as pass`; verdict.json keeps the verdict's "
            "code 4)") in md
    assert ("next: the candidate differs from its good end only in "
            "hash-topk-scaling:double-scale") in r.stderr


def test_split_k_merge_fault_warns_at_long_context(tmp_path: Path, cache: Path) -> None:
    # The merge fault only acts beyond ~768 tokens (more than one 64-key split): one 2048-token
    # drift transcript shows it in its far position buckets.
    runs = tmp_path / "runs"
    r = cli("run", "reference", "--tier", "ci", "--out", runs, "--json",
            "--set", "patches.mma-decode.variant=merge-no-rescale",
            "--set", "probe.families=[drift]", "--set", "probe.lengths=[2048]",
            "--warn-as", "warn", cache=cache)
    assert r.returncode == 4, r.stderr  # a WARN's own exit code when asked for
    assert "\n- exit 4; status `done`" in (only_run_dir(runs) / "report.md").read_text()
    v = load_json(r.stdout)
    assert v["verdict"] == "WARN" and v["drift"]["status"] == "warn"
    far = {k: view["status"] for k, view in v["drift"]["views"].items()
           if k.startswith("positions ") and int(k.split()[1].split("-")[0]) >= 512}
    assert far and set(far.values()) == {"warn"}, far  # every far bucket beyond its null


def test_an_engine_that_never_becomes_healthy_cannot_be_tested(tmp_path: Path,
                                                               cache: Path) -> None:
    # http.server answers 404 on /health forever: alive, never ready.
    argv = [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
    profile = command_profile(tmp_path, "never-ready", argv, ready="/health", timeout=3)
    r = cli("run", profile, "--tier", "ci", "--out", tmp_path / "runs", "--json", cache=cache)
    assert r.returncode == 125, r.stderr
    v = load_json(r.stdout)
    assert "not ready after 3 s" in v["reasons"][0]
    assert "404" in v["reasons"][1]  # the server's own log line, in the tail


def test_a_patch_that_crashes_the_engine_at_start_fails_with_signature_crash(
        tmp_path: Path, cache: Path) -> None:
    profile = fault_profile(tmp_path, "crash-start", "mhc-bf16", "--crash-at-start")
    runs = tmp_path / "runs"
    r = cli("run", profile, "--tier", "ci", "--out", runs, "--json", cache=cache)
    assert r.returncode == 1, r.stderr
    v = load_json(r.stdout)
    assert v["verdict"] == "FAIL" and v["signatures"]["hard_fail"]
    crash = v["signatures"]["crash"]
    assert crash["arm"] == "candidate" and len(crash["attempts"]) == 2
    assert all(a["phase"] == "start" and a["returncode"] == 3 for a in crash["attempts"])
    assert v["reasons"][0].startswith("crash:")
    assert "good end ran without crashing" in v["reasons"][0]
    assert "simulated crash at start" in v["reasons"][1]  # the log tail
    doc = load(only_run_dir(runs) / "run.json")
    assert doc["arms"]["baseline"]["crashes"] == [] and doc["arms"]["candidate"]["attempts"] == 2
    report = (only_run_dir(runs) / "report.md").read_text()
    assert "## Crashes" in report and "simulated crash at start" in report


@pytest.mark.slow  # a minute on a loaded 2-core machine: CI stays under 20 min
def test_an_engine_that_dies_mid_probe_every_time_fails_with_signature_crash(
        tmp_path: Path, cache: Path) -> None:
    profile = fault_profile(tmp_path, "die-mid-probe", "mhc-bf16", "--die-after", "2")
    r = cli("run", profile, "--tier", "ci", "--out", tmp_path / "runs", "--json", cache=cache)
    assert r.returncode == 1, r.stderr
    v = load_json(r.stdout)
    attempts = v["signatures"]["crash"]["attempts"]
    assert len(attempts) == 2 and all(a["phase"] == "probe" for a in attempts)
    assert "killed the engine after 2 probe requests" in v["reasons"][1]


@pytest.mark.slow  # a minute on a loaded 2-core machine: CI stays under 20 min
def test_a_free_port_lost_to_another_process_is_retried_on_a_new_port(tmp_path: Path,
                                                                      cache: Path) -> None:
    marker = tmp_path / "lost-once"
    argv = [sys.executable, str(FAULT_SERVER), "--lose-port-once", str(marker), "--", *SERVE_ARGS]
    profile = command_profile(tmp_path, "lose-port", argv)
    runs = tmp_path / "runs"
    r = cli("run", profile, "--tier", "ci", "--out", runs, cache=cache)
    assert r.returncode == 0, r.stderr  # same configuration at both ends: PASS
    arms = load(only_run_dir(runs) / "run.json")["arms"]
    assert arms["baseline"]["port_retries"] == 1 and arms["baseline"]["attempts"] == 2
    assert arms["baseline"]["crashes"] == [] and arms["candidate"]["port_retries"] == 0
    assert "relaunching on another" in r.stderr


def test_a_configuration_that_cannot_start_is_never_launched(tmp_path: Path,
                                                             cache: Path) -> None:
    # SGLang 0.5.13 with an NVFP4 checkpoint does not start without hash-topk-scaling.
    runs = tmp_path / "runs"
    r = cli("run", "dsv4-flash-tp8", "--disable", "hash-topk-scaling", "--out", runs, cache=cache)
    assert r.returncode == 5
    assert "cannot start" in r.stderr and "hash-topk-scaling" in r.stderr
    assert not runs.exists()


def load_json(text: str) -> dict:
    import json

    return dict(json.loads(text))
