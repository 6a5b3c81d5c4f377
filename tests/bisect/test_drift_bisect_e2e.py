"""Issue 41, items 4 and 7 end to end: the issue's drift bisect on the embedded engine.

`bisect reference-all --set patches.hash-topk-scaling.variant=double-scale` named
{hash-topk-scaling, mhc-bf16} as equals, though the fault drifts ×1.9e3 the null and mhc-bf16
alone ×20; its trial table said FAIL beside "drift warn", and the pasted line said WARN, exit 0.
Here: the culprit that carries the bad end's drift comes first, with its variant; the terminal
prints every Reproduce line and the culprit-alone line; and that line, pasted, exits as the
trial was counted (1: fail).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(3000)
def test_the_drift_bisect_says_one_thing_from_trial_to_headline(cli, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    r = cli("bisect", "reference-all", "--set", "patches.hash-topk-scaling.variant=double-scale",
            "--json", "--out", runs, cwd=tmp_path, timeout=2900)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout)
    assert report["status"] in ("found", "several"), report["headline"]
    first = report["headline"].split("{", 1)[1] if report["status"] == "found" else \
        report["headline"].split(": ", 1)[1]
    assert first.startswith("hash-topk-scaling (variant double-scale)"), report["headline"]
    if report["status"] == "several":  # ranked by their share of the bad end's drift
        shares = report["culprit_shares"]
        assert shares["hash-topk-scaling"] == max(shares.values()), shares
        assert "ranked by their share of the bad end's drift" in report["headline"]
    for trial in report["trials"]:  # one vocabulary: `run`'s verdict, what it was counted as
        if trial["run_verdict"] == "WARN" and trial["outcome"] in ("pass", "fail"):
            assert trial["counted_as"].startswith(trial["outcome"])
            assert f"--warn-as {trial['outcome']}" in trial["reproduce"]
    # the terminal: the Reproduce lines and the culprit alone, not only report.md
    assert "reproduce (each trial as `dsv4bisect run` measures it" in r.stderr
    assert "the culprit alone: dsv4bisect run reference-all" in r.stderr
    (alone, *_) = report["culprit_lines"]
    argv = shlex.split(alone.split("  #", 1)[0])
    pasted = cli(*argv[1:], "--out", tmp_path / "pasted", "--skip-preflight", cwd=tmp_path,
                 timeout=1200)
    assert pasted.returncode == 1, pasted.stderr[-3000:]  # counted as fail: exits 1
