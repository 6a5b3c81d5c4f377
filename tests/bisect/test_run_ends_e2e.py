"""A bisect after the `run` that failed (docs/bisect.md, "The ends a failing run already
measured"), end to end on the embedded engine: `run` caches its baseline and its candidate, the
bisect of the same profile and patch then installs both as seed block 0's settled full-tier
ends — no request for either end — and names the same culprit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bisect.test_end_looks_e2e import _trials

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3000)]

FAULT = "patches.mma-decode.variant=swa-ring-stale"


def test_a_bisect_after_a_failing_run_sends_no_request_for_block_0s_ends(cli, tmp_path) -> None:
    runs = tmp_path  # --out: run directories go under an existing directory
    r = cli("run", "reference-all", "--set", FAULT, "--json", "--out", runs / "run",
            cwd=tmp_path, timeout=1500)
    assert r.returncode == 1, r.stderr[-4000:]  # FAIL
    assert json.loads(r.stdout)["verdict"] == "FAIL"
    r = cli("bisect", "reference-all", "--set", FAULT, "--json", "--out", runs / "bisect",
            cwd=tmp_path, timeout=2900)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout)
    assert report["status"] == "found" and report["culprits"] == ["mma-decode"], report
    assert report["remedy"]["verdict"] == "passes"
    trials = _trials(runs / "bisect")
    ends = [t for t in trials if t["seed_block"] == 0 and t["details"].get("ends_from_run")]
    good = [t for t in ends if not t["patches"]]
    bad = [t for t in ends if t["details"].get("bad_end_cached")]
    assert len(good) == 1 and len(bad) == 1, [t["details"] for t in trials]
    assert good[0]["details"]["requests"] == 0 and good[0]["details"]["baseline_cached"]
    assert bad[0]["details"]["requests"] == 0 and bad[0]["verdict"] == "FAIL"
    assert bad[0]["details"]["end_look"] == 2  # the run's ends are the full tier's
    assert not any(t["details"].get("ends_measured") for t in trials if t["seed_block"] == 0)
    b0 = Path(report["run_dir"]) / "ends" / "b0"
    assert json.loads((b0 / "settled.json").read_text())["look"] == 2
    assert not (b0 / "look1").exists()  # nothing was probed at look 1
    table = next(t for t in report["trials"] if t["ledger_trial"] == bad[0]["id"])
    assert table["bad_end_cached"] is True and table["requests"] == 0
