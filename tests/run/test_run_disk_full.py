"""Disk full mid-`run` (issue 30, item 10): exit 125 with one `error:` line and a hint, never a
traceback. The run record says `error` although the disk is full (its reserve takes the end:
it stayed `running` before, issue 40 item 7), and the hint is the run's, not `bisect --resume`.
Real storage: the runs root is a small tmpfs that the candidate's engine fills after a few
probe requests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from run_helpers import cli, fault_profile, load, only_run_dir

from dsv4bisect.run.record import reconcile_abandoned

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture
def tmpfs(mount_tmpfs: Callable[[str], Path]) -> Path:
    return mount_tmpfs("32m")


@pytest.mark.slow  # a minute on a loaded 2-core machine: CI stays under 20 min
def test_disk_full_mid_run_is_125_and_leaves_a_reconcilable_record(tmp_path: Path,
                                                                   tmpfs: Path) -> None:
    profile = fault_profile(tmp_path, "fills", "mma-decode", "--fill-disk-after", "2",
                            str(tmpfs / "filler"))
    runs = tmpfs / "runs"
    r = cli("run", profile, "--tier", "ci", "--out", runs, cache=tmp_path / "cache")
    assert r.returncode == 125, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-2].startswith("error: ") and "no space left" in lines[-2], lines[-2:]
    assert lines[-1].startswith("hint: ") and "run the command again" in lines[-1]
    assert "--resume" not in lines[-1]
    run_dir = only_run_dir(runs)
    record = load(run_dir / "run.json")  # read while the disk is still full
    assert record["status"] == "error" and record["exit_code"] == 125
    assert "no space left" in record["error"]["message"]
    (tmpfs / "filler").unlink()
    assert reconcile_abandoned(runs) == []  # nothing left `running`
    report = cli("report", run_dir, cache=tmp_path / "cache")
    assert report.returncode == 0 and "Traceback" not in report.stderr
