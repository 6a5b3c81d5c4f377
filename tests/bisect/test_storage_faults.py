"""A full disk or a runs root made read-only mid-bisect ends with exit 125 and a state that
`--resume` continues once the storage is back (issue 30, item 10). Before, SQLite's "database
or disk is full" at COMMIT, an OSError or a PermissionError on a trial directory escaped as a
traceback (exit 70). Real storage, not a mock: a small tmpfs (needs root to mount)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).parent
NOISELESS = ("--false-fail", "0", "--false-pass", "0")


@pytest.fixture
def tmpfs(mount_tmpfs: Callable[[str], Path]) -> Path:
    return mount_tmpfs("8m")


def _check_script(home: Path, log: Path, fault: str) -> None:
    """A --test-cmd that injects `fault` (shell) once, during its third call."""
    (home / "tc.sh").write_text(
        "#!/bin/sh\n"
        f'n=$(grep -c "^start" {log} 2>/dev/null || echo 0)\n'
        f'if [ "$n" -ge 2 ] && [ ! -e {home}/faulted ]; then touch {home}/faulted; {fault}; fi\n'
        f"exec {sys.executable} {HERE / 'fake_check.py'} {log} triton-indexer\n")
    (home / "tc.sh").chmod(0o755)


def _resume_finds_the_culprit(cli, runs: Path, home: Path) -> None:
    (run_dir,) = [p for p in runs.iterdir() if "-bisect-" in p.name]
    resumed = cli("bisect", "--resume", run_dir, "--json", cwd=home)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json.loads(resumed.stdout)
    assert report["status"] == "found" and report["culprits"] == ["triton-indexer"]


def test_disk_full_mid_bisect_is_125_then_resumes(cli, tmpfs: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    runs = tmpfs / "runs"
    _check_script(home, home / "calls.log",
                  f"head -c 64M /dev/zero > {tmpfs}/filler 2>/dev/null")
    first = cli("bisect", "--test-cmd", "./tc.sh", *NOISELESS, "--out", runs, cwd=home)
    assert first.returncode == 125, first.stderr[-3000:]
    assert "Traceback" not in first.stderr and "internal error" not in first.stderr
    lines = first.stderr.strip().splitlines()
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: ")
    assert "--resume" in lines[-1]
    (tmpfs / "filler").unlink()
    _resume_finds_the_culprit(cli, runs, home)


def test_a_runs_root_made_read_only_mid_bisect_is_125_then_resumes(cli, tmpfs: Path,
                                                                    tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    runs = tmpfs / "runs"
    # A read-only bind mount over the runs root: what the bisect opens from now on is refused
    # (EROFS), as on a root whose file system went read-only or whose permissions were taken.
    _check_script(home, home / "calls.log",
                  f"mount --bind {runs} {runs} && mount -o remount,bind,ro {runs}")
    first = cli("bisect", "--test-cmd", "./tc.sh", *NOISELESS, "--out", runs, cwd=home)
    assert first.returncode == 125, first.stderr[-3000:]
    assert "Traceback" not in first.stderr and "read-only file system" in first.stderr
    subprocess.run(["umount", str(runs)], check=True)
    _resume_finds_the_culprit(cli, runs, home)
