"""The default `dsv4bisect run` (reference-all, smoke tier) from a cold cache: the Done-when run.

Slow (about two minutes on 2 CPU cores). The 150 s budget (issue 25: now with a concurrent arm
and a warm arm) is asserted only when the machine is quiet at the start (load average below 1):
on a shared machine other work decides the wall time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from run_helpers import cli, load, only_run_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]
SMOKE_BUDGET_S = 150.0


def test_default_run_warns_on_the_six_patches_drift_within_the_smoke_budget(
        tmp_path: Path) -> None:
    quiet = os.getloadavg()[0] < 1.0
    t0 = time.monotonic()
    r = cli("run", "--no-cache", "--out", tmp_path / "runs", "--json", cache=tmp_path / "cache")
    wall = time.monotonic() - t0
    # No fault: the six real patches lose no fact, so the run does not FAIL. Their drift at
    # precision deployment (bf16 patches on NVFP4 W4A4 experts, docs/reference-engine.md
    # "Precision") is a WARN, said as a multiple of the good end's own variation, and a WARN
    # exits 0 (git bisect run counts it good).
    assert r.returncode == 0, r.stderr
    v = load(only_run_dir(tmp_path / "runs") / "verdict.json")
    assert v["verdict"] == "WARN" and v["probe"]["tier"] == "smoke"
    assert v["drift"]["status"] == "warn" and v["drift"]["multiple"] > 1
    for family in ("needle", "copy"):
        assert v["families"][family]["evidence"], family
        assert v["families"][family]["baseline_accuracy"] >= 0.9, family
    assert v["aa"]["flips"] == 0
    assert any("A/A repeat covers 48 of 96" in x for x in v["reasons"])
    for family in ("needle", "copy", "vartrack"):  # cold alone, warm among 16, short ones hit
        hit = {"hit@1": 12} if family != "copy" else {}
        assert v["conditions"][family]["requests"] == {"cold@1": 12, **hit, "warm@16": 12}
    assert set(v["throughput"]["candidate"]) == {"1", "16"}
    doc = load(only_run_dir(tmp_path / "runs") / "run.json")
    assert doc["timing"]["overlapped"] and doc["arms"]["candidate"]["attempts"] == 1
    print(f"smoke run: {wall:.1f} s wall (run.json {doc['wall_s']:.1f} s), load average "
          f"{os.getloadavg()[0]:.2f} at the end")
    if quiet:
        assert wall <= SMOKE_BUDGET_S
