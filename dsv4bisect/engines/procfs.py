"""What Linux `/proc` says about processes: identity (PID + start time), groups, sockets.

A PID alone does not name a process: PIDs are reused. A PID together with its start time
(field 22 of `/proc/PID/stat`, in clock ticks since boot) does, so every record we keep of an
engine process carries both, and nothing is ever signalled unless both still match.

Everything here answers "unknown" (None, empty) where `/proc` is absent (macOS) or unreadable
(another user's process); callers decide what unknown means for them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str  # R, S, D, Z (zombie: exited, holds nothing), ...
    ppid: int
    pgrp: int
    session: int
    start_time: int  # clock ticks after boot (field 22)


def available() -> bool:
    return (PROC / "self" / "stat").is_file()


def stat(pid: int) -> ProcStat | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    fields = text[text.rfind(")") + 2:].split()
    try:
        return ProcStat(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[3]),
                        int(fields[19]))
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    st = stat(pid)
    return st.start_time if st else None


def pids() -> Iterator[int]:
    try:
        entries = list(PROC.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.isdigit():
            yield int(entry.name)


def same_process(pid: int, started: int | None) -> bool:
    """True while the process `pid` that started at `started` is alive (not a zombie)."""
    st = stat(pid)
    return st is not None and st.state != "Z" and started is not None \
        and st.start_time == started


def with_environ(entry: str) -> list[int]:
    """Live (non-zombie) processes whose environment, as they were started with it, holds
    `entry` ("NAME=value"); another user's processes are unreadable and left out."""
    want = entry.encode()
    out = []
    for pid in pids():
        try:
            environ = (PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if want in environ.split(b"\0"):
            st = stat(pid)
            if st is not None and st.state != "Z":
                out.append(pid)
    return out


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`."""
    out = []
    for pid in pids():
        st = stat(pid)
        if st is not None and st.pgrp == pgid and st.state != "Z":
            out.append(pid)
    return out


def descendants_of(roots: set[int]) -> set[int]:
    """`roots` and every live process below them, or in a group or session they lead.

    Ancestry covers an engine's worker that made its own session; group and session cover a
    worker whose parent already exited (it is reparented, but keeps its group).
    """
    table = {st.pid: st for st in map(stat, list(pids())) if st is not None}
    ours = set(roots)
    for pid, st in table.items():
        if st.pgrp in roots or st.session in roots:
            ours.add(pid)
            continue
        seen, cur = 0, st.ppid
        while cur > 1 and seen < 64:  # bounded: a cycle in a racing snapshot cannot loop
            if cur in roots:
                ours.add(pid)
                break
            parent = table.get(cur)
            if parent is None:
                break
            cur, seen = parent.ppid, seen + 1
    return ours


def cmdline(pid: int, limit: int = 200) -> str | None:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    if not argv:
        return None
    from dsv4bisect.config.engine_config import redact_argv  # a holder's --api-key stays hidden

    text = " ".join(redact_argv(argv))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def uid_of(pid: int) -> int | None:
    try:
        return os.stat(PROC / str(pid)).st_uid
    except OSError:
        return None


def socket_inodes(pid: int) -> set[int] | None:
    """Inodes of the sockets `pid` has open; None when its fds cannot be read (another user)."""
    fd_dir = PROC / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    out = set()
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out
