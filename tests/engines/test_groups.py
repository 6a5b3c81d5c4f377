"""Orphaned engine groups: only recorded ones, matched by PID and start time, with a dead owner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bisect.engines import groups, procfs

pytestmark = pytest.mark.skipif(not procfs.available(), reason="needs Linux /proc")


def _engine() -> subprocess.Popen[bytes]:
    """A stand-in engine process: its own session, like the launcher's."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)


def _record(arm: Path, owner: dict[str, object], proc: subprocess.Popen[bytes],
            start_time: int | None = None) -> Path:
    arm.mkdir(parents=True)
    started = procfs.start_time(proc.pid) if start_time is None else start_time
    doc = {"schema": groups.SCHEMA, "owner": owner,
           "groups": [{"role": "server", "pid": proc.pid, "start_time": started,
                       "state": "running", "argv0": sys.executable}]}
    path = arm / groups.RECORD
    path.write_text(json.dumps(doc))
    return path


def test_only_recorded_groups_of_dead_owners_matching_pid_and_start_time_are_stopped(
        tmp_path: Path) -> None:
    dead_owner = {"pid": os.getpid(), "start_time": -1}  # our PID, another start: gone
    orphan, reused, sibling, unrecorded, trial = (_engine() for _ in range(5))
    try:
        path = _record(tmp_path / "run-a" / "candidate", dead_owner, orphan)
        # the recorded PID now belongs to a process that started at another time: never touched
        _record(tmp_path / "run-b" / "candidate", dead_owner, reused,
                start_time=(procfs.start_time(reused.pid) or 0) + 7)
        # a live owner (this process): a sibling run in progress, never touched
        _record(tmp_path / "run-c" / "baseline", groups.identity(), sibling)
        # a bisect trial's run, deeper in the tree
        _record(tmp_path / "bis" / "trials" / "000-x" / "run" / "candidate", dead_owner, trial)

        stopped = groups.stop_orphans(tmp_path)

        assert sorted(o.pid for o in stopped) == sorted([orphan.pid, trial.pid])
        assert orphan.wait(timeout=10) is not None and trial.wait(timeout=10) is not None
        for proc in (reused, sibling, unrecorded):
            assert proc.poll() is None
        assert "left running by a killed dsv4bisect" in stopped[0].sentence()
        assert json.loads(path.read_text())["groups"][0]["state"] == "stopped"
        assert groups.stop_orphans(tmp_path) == []  # once only
    finally:
        for proc in (orphan, reused, sibling, unrecorded, trial):
            proc.kill()
            proc.wait()


def test_wait_gone_is_bounded_and_names_what_is_left(tmp_path: Path) -> None:
    proc = _engine()
    try:
        assert groups.wait_gone(proc.pid, timeout=0.2) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert groups.wait_gone(proc.pid, timeout=5) == []
