"""Orphaned engine groups: only recorded ones, matched by PID and start time, with a dead owner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4bisect import env
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


def test_an_owner_killed_between_the_spawn_and_its_record_still_leaves_the_engine_findable(
        tmp_path: Path) -> None:
    """The window a SIGKILLed Ray worker hit under load: the child existed, its PID was never
    written. The entry written before the spawn names it by its environment."""
    arm = tmp_path / "run" / "candidate"
    arm.mkdir(parents=True)
    record = groups.GroupRecord(arm)
    launch = record.spawning("server")
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            "time.sleep(120)")
    child = subprocess.Popen(  # the engine and, inheriting the entry, a worker of its own
        [sys.executable, "-c", code], start_new_session=True,
        env={**os.environ, env.LAUNCH: launch})
    other = subprocess.Popen(  # another launch's engine: another entry, never touched
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
        env={**os.environ, env.LAUNCH: "0" * 32})
    try:
        doc = json.loads((arm / groups.RECORD).read_text())
        assert doc["groups"] == [{"role": "server", "launch": launch, "state": "spawning"}]
        doc["owner"] = {"pid": os.getpid(), "start_time": -1}  # ... and then the owner died
        (arm / groups.RECORD).write_text(json.dumps(doc))
        wait = 0
        while len(procfs.group_members(child.pid)) < 2 and wait < 200:  # the worker is up
            time.sleep(0.05)
            wait += 1
        workers = [p for p in procfs.group_members(child.pid) if p != child.pid]

        stopped = groups.stop_orphans(tmp_path)

        assert [o.pid for o in stopped] == [child.pid]  # the leader only; its group with it
        assert child.wait(timeout=10) is not None
        assert not [p for p in workers if procfs.stat(p) and procfs.stat(p).state != "Z"]
        assert other.poll() is None
        assert json.loads((arm / groups.RECORD).read_text())["groups"][0]["state"] == "stopped"
    finally:
        for proc in (child, other):
            proc.kill()
            proc.wait()


def test_a_recorded_spawn_fills_its_entry_and_a_failed_one_is_marked_stopped(
        tmp_path: Path) -> None:
    record = groups.GroupRecord(tmp_path)
    ok, bad = record.spawning("prefill"), record.spawning("decode")
    record.add("prefill", os.getpid(), sys.executable, ok)
    record.failed(bad)
    entries = json.loads((tmp_path / groups.RECORD).read_text())["groups"]
    assert [(g["role"], g["state"], g.get("pid")) for g in entries] == [
        ("prefill", "running", os.getpid()), ("decode", "stopped", None)]
    record.stopped(os.getpid())  # the teardown after it: the failed entry has no PID
    entries = json.loads((tmp_path / groups.RECORD).read_text())["groups"]
    assert [g["state"] for g in entries] == ["stopped", "stopped"]
