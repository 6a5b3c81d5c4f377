"""Was an engine's SIGKILL the kernel's out-of-memory killer? The cgroup's OOM-kill count says.

An engine ended by SIGKILL, SIGTERM, SIGINT or SIGHUP that dsv4bisect did not send was stopped
from outside (an operator, another job, a cluster's pre-emption): no measurement of its
configuration, so CANNOT_TEST. The one exception is the OOM killer, which also sends SIGKILL
but for a reason that *is* the configuration's (it asked for more memory than there is): then
the memory cgroup's `oom_kill` count rose between the spawn and the exit.

cgroup v2: `<mount>/<path>/memory.events` (`oom_kill N`); v1: `<mount>/memory/<path>/
memory.oom_control` (`oom_kill N`). In a container the mount's root is the container's own
cgroup, so the path from /proc/PID/cgroup may not exist below it: the mount root is tried then.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def memory_cgroup(pid: int, root: Path = CGROUP_ROOT) -> Path | None:
    """The file holding the OOM-kill count of `pid`'s memory cgroup, or None (no cgroups)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "" and line.startswith("0::"):
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    candidates = []
    if v1 is not None:
        base = root / "memory"
        candidates += [base / v1.lstrip("/") / "memory.oom_control", base / "memory.oom_control"]
    if v2 is not None:
        candidates += [root / v2.lstrip("/") / "memory.events", root / "memory.events"]
    return next((c for c in candidates if c.is_file()), None)


def oom_kills(events: Path | None) -> int | None:
    """The `oom_kill` count in a memory.events / memory.oom_control file (None: unknown)."""
    if events is None:
        return None
    try:
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None
