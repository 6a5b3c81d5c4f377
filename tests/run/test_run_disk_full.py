"""Disk full mid-`run` (issue 30, item 10): exit 125 with one `error:` line and a hint, never a
traceback; the run record is left for the next run on the root to reconcile. Real storage: the
runs root is a small tmpfs that the candidate's engine fills after a few probe requests."""

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
    assert lines[-1].startswith("hint: ")
    (tmpfs / "filler").unlink()
    run_dir = only_run_dir(runs)
    status = load(run_dir / "run.json")["status"]
    if status == "running":  # the full disk could not take the record's end either
        assert reconcile_abandoned(runs) == [run_dir]
        status = load(run_dir / "run.json")["status"]
    assert status in ("abandoned", "error")
    report = cli("report", run_dir, cache=tmp_path / "cache")
    assert report.returncode == 0 and "Traceback" not in report.stderr
