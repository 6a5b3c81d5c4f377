"""The node reaper: a real launcher process records a real engine group in its own session,
is killed with SIGKILL, and the reaper (its own session too) stops the group. While the
launcher lives, the reaper leaves the group alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dsv4bisect.engines import procfs, reaper

LAUNCHER = """
import subprocess, sys, time
from pathlib import Path
from dsv4bisect.engines.groups import GroupRecord
arm = Path(sys.argv[1])
arm.mkdir(parents=True)
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                          start_new_session=True)
GroupRecord(arm).add("server", engine.pid, sys.executable)
print(engine.pid, flush=True)
time.sleep(600)
"""


def _wait(pred, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_reaper_stops_the_engines_of_a_killed_launcher_and_only_then(tmp_path: Path) -> None:
    root = tmp_path / "ray-trials" / "node"
    arm = root / "bisect-run" / "trials" / "000-abc-b0-a1" / "run" / "candidate"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(arm)],
                                stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    engine = int(launcher.stdout.readline())
    start = procfs.start_time(engine)
    watcher = reaper.spawn(root, launcher.pid)
    try:
        time.sleep(1.5)  # several polls: the launcher is alive, so its engine is left alone
        assert procfs.same_process(engine, start) and watcher.poll() is None
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        assert _wait(lambda: not procfs.same_process(engine, start)), "engine outlived its launcher"
        assert watcher.wait(timeout=20) == 0
        assert "stopped engine process group" in (root / "reaper.log").read_text()
    finally:
        for pid in (engine, launcher.pid):
            try:
                os.killpg(pid, signal.SIGKILL) if pid == engine else os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if watcher.poll() is None:
            watcher.kill()
