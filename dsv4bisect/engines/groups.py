"""Engine process groups: recorded where they were launched, waited for, and stopped if orphaned.

`kill -9` of `dsv4bisect run` (or `bisect`) gives it no chance to stop its engines. So every
launch writes `engines.json` into its arm directory before and after each process is spawned:

    {"schema": "dsv4bisect.engines/1",
     "owner":  {"pid", "start_time"},            # the dsv4bisect process that launched them
     "groups": [{"role", "launch", "pid", "start_time", "state": spawning|running|stopped,
                 "argv0"}]}

`launch` (a random id, also in the child's environment as DSV4BISECT_LAUNCH) is written before
the spawn: an owner killed after the child exists but before its PID is recorded leaves an entry
in state `spawning` without a PID, and its group leader is then found by that environment entry.

Each engine process leads its own session and process group (`start_new_session`), so its PID is
its group id. The next `run` or `bisect` on the same runs root calls `stop_orphans(root)`: a group
is stopped only when (1) the record file is ours (our uid), (2) its owner is gone — no process
with that PID *and* start time — so a live colleague's or sibling run's engines are never touched,
and (3) the group's leader is alive with the recorded PID *and* start time (`/proc/PID/stat`
field 22). Nothing is ever found by port or by name. After that first match the group id stays
reserved while any member lives (Linux does not reuse a PID that is still some process's group
id), which is why the SIGKILL that follows the grace period may go to the group even when its
leader has exited first.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4bisect.base.bounded import load_json
from dsv4bisect.engines import procfs
from dsv4bisect.engines.rundir import write_json
from dsv4bisect.env import LAUNCH
from dsv4bisect.errors import ConfigError

RECORD = "engines.json"
SCHEMA = "dsv4bisect.engines/1"
GONE_TIMEOUT_S = 10.0  # how long a SIGKILLed group may take to vanish (D state, a loaded box)
POLL_S = 0.05
# Where records live under a runs root: run/arm; bisect/trials/trial/run/arm (fresh trials);
# bisect/engines/engine (the engines a hot bisect keeps up); bisect/trials/trial/engine (its
# fresh-launch confirmation)
PATTERNS = (f"*/*/{RECORD}", f"*/trials/*/*/*/{RECORD}", f"*/engines/*/{RECORD}",
            f"*/trials/*/*/{RECORD}")


def identity(pid: int | None = None) -> dict[str, Any]:
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start_time": procfs.start_time(pid)}


class GroupRecord:
    """The `engines.json` of one launch (atomic rewrites: a reader never sees half a file)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / RECORD
        self.doc: dict[str, Any] = {"schema": SCHEMA, "owner": identity(), "groups": []}

    def spawning(self, role: str) -> str:
        """Record a spawn before it happens. The value returned goes into the child's
        environment (`env.LAUNCH`), so an owner killed after the child exists and before `add`
        still leaves a record that names it (`stop_orphans` finds it by that entry)."""
        launch = uuid.uuid4().hex
        self.doc["groups"].append({"role": role, "launch": launch, "state": "spawning"})
        self._save()
        return launch

    def add(self, role: str, pid: int, argv0: str, launch: str | None = None) -> None:
        entry = self._entry(launch)
        if entry is None:
            entry = {"role": role}
            self.doc["groups"].append(entry)
        entry.update(pid=pid, start_time=procfs.start_time(pid), state="running", argv0=argv0)
        self._save()

    def failed(self, launch: str) -> None:
        """The spawn announced by `spawning` raised: nothing was started."""
        entry = self._entry(launch)
        if entry is not None:
            entry["state"] = "stopped"
            self._save()

    def _entry(self, launch: str | None) -> dict[str, Any] | None:
        return next((g for g in self.doc["groups"] if launch and g.get("launch") == launch),
                    None)

    def stopped(self, pid: int) -> None:
        for group in self.doc["groups"]:
            if group.get("pid") == pid:  # a failed spawn has none
                group["state"] = "stopped"
        self._save()

    def _save(self) -> None:
        try:
            write_json(self.path, self.doc)
        except OSError:  # a full disk must not stop a teardown; the record is a safety net
            pass


def wait_gone(pgid: int, timeout: float = GONE_TIMEOUT_S) -> list[int]:
    """Wait (bounded) until process group `pgid` has no live member; the members left, if any.
    Without /proc, `killpg(pgid, 0)` is asked instead (zombies then count as alive)."""
    deadline = time.monotonic() + timeout
    while True:
        if procfs.available():
            left = procfs.group_members(pgid)
        else:
            try:
                os.killpg(pgid, 0)
                left = [pgid]
            except (ProcessLookupError, PermissionError):
                left = []
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(POLL_S)


@dataclass(frozen=True)
class Orphan:
    pid: int
    role: str
    record: Path
    left: tuple[int, ...]  # members still alive after SIGKILL (none, normally)

    def sentence(self) -> str:
        where = self.record.parent
        tail = f"; still alive after SIGKILL: {list(self.left)}" if self.left else ""
        return (f"stopped engine process group {self.pid} (`{self.role}`) left running by a "
                f"killed dsv4bisect in {where}{tail}")


def records(root: Path) -> list[Path]:
    found: list[Path] = []
    for pattern in PATTERNS:
        try:
            found.extend(root.glob(pattern))
        except OSError:
            continue
    return sorted(set(found))


def stop_orphans(root: Path, grace_s: float = 5.0) -> list[Orphan]:
    """Stop the engine groups that dead owners recorded under `root` (see the module doc)."""
    stopped: list[Orphan] = []
    for path in records(root):
        doc = _own_record(path)
        if doc is None:
            continue
        owner = doc.get("owner") or {}
        if procfs.same_process(int(owner.get("pid") or 0), owner.get("start_time")):
            continue  # its launcher is alive: not an orphan (a sibling run, or ourselves)
        changed = False
        for group in doc.get("groups", []):
            if group.get("state") == "stopped":
                continue
            pid, started = int(group.get("pid") or 0), group.get("start_time")
            if pid > 1:
                leaders = [pid] if procfs.same_process(pid, started) else []
            else:  # spawned but never recorded (the owner died in between): its launch entry
                leaders = _unrecorded(group.get("launch"))
            for leader in leaders:
                left = _stop_group(leader, grace_s)
                stopped.append(Orphan(leader, str(group.get("role")), path, tuple(left)))
            group["state"] = "stopped"
            changed = True
        if changed:
            try:
                write_json(path, doc)
            except OSError:
                pass
    return stopped


def _unrecorded(launch: object) -> list[int]:
    """The group leaders started with this launch entry in their environment (an engine's own
    children inherit it but are not leaders: stopping the group stops them)."""
    if not isinstance(launch, str) or not launch:
        return []
    found = procfs.with_environ(f"{LAUNCH}={launch}")
    return [pid for pid in found if (st := procfs.stat(pid)) is not None and st.pgrp == pid]


def _own_record(path: Path) -> dict[str, Any] | None:
    try:
        if path.stat().st_uid != os.getuid():
            return None  # someone else's run directory: never act on it
        doc = load_json(path, "run")
    except (OSError, ConfigError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def _stop_group(pgid: int, grace_s: float) -> list[int]:
    if pgid == os.getpgrp():  # never our own group
        return []
    _killpg(pgid, signal.SIGTERM)
    left = wait_gone(pgid, grace_s)
    if left:
        _killpg(pgid, signal.SIGKILL)
        left = wait_gone(pgid)
    return left


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
