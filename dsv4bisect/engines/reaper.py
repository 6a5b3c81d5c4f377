"""A watcher that stops the engines a process recorded once that process is gone.

Engines lead their own sessions (engines/groups.py), so they outlive a launcher that is killed
without a chance to stop them. Locally the next `run`/`bisect` on the runs root stops them
(`stop_orphans`); a trial on a cluster node has no "next run" there. So each process that
launches engines on a node (the Ray executor's actor) starts this reaper beside it, in a session
of its own so that whatever kills the launcher (its worker killed, its raylet gone, the driver's
job ended) does not kill the reaper too:

    python -m dsv4bisect.engines.reaper ROOT OWNER_PID OWNER_START_TIME

It polls until no process has that PID *and* start time, then calls `stop_orphans(ROOT)`: the
same rule as everywhere (only records under ROOT that are ours, whose owner is gone, whose
leader still matches its recorded PID and start time), and exits.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from dsv4bisect.engines import procfs
from dsv4bisect.engines.groups import Orphan, identity, stop_orphans

POLL_S = 0.5


def watch(root: Path, owner_pid: int, owner_start: int | None,
          poll_s: float = POLL_S) -> list[Orphan]:
    """Block until the owner is gone, then stop the engines recorded under `root`."""
    while procfs.same_process(owner_pid, owner_start):
        time.sleep(poll_s)
    return stop_orphans(root)


def spawn(root: Path, owner_pid: int | None = None) -> subprocess.Popen[bytes]:
    """Start a reaper for the engines `owner_pid` (default: this process) records under
    `root`; it runs in its own session and outlives the owner."""
    owner = identity(owner_pid)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "reaper.log", "ab") as log:  # what it stopped, one sentence a line
        return subprocess.Popen(
            [sys.executable, "-m", "dsv4bisect.engines.reaper", str(root), str(owner["pid"]),
             str(owner["start_time"])],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            start_new_session=True, close_fds=True)


def main(argv: list[str]) -> int:
    root, pid, start = Path(argv[0]), int(argv[1]), argv[2]
    for orphan in watch(root, pid, None if start == "None" else int(start)):
        print(orphan.sentence(), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
