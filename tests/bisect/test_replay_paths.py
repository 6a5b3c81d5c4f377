"""Where a bisect writes and what a resume replays (issue 40, item 7), with real processes.

- A dangling symlink at `<runs root>/ledger.sqlite` made `bisect` create a SQLite file at the
  link's target (exit 0): it is refused, exit 5, and nothing is created there.
- A resume whose recorded test directory was deleted spent 49 trials on CANNOT_TEST `not-run`
  before exit 125: it is one error at once (exit 5), and no trial runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


def dsv4bisect(tmp_path: Path, *args: str, cwd: Path | None = None
               ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DSV4BISECT_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "dsv4bisect", *args], cwd=cwd or tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)


def script(folder: Path, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tc.sh").write_text("#!/bin/sh\n" + body)
    (folder / "tc.sh").chmod(0o755)


FAILS_WITH_MMA = 'case "$DSV4BISECT_PATCHES" in *mma-decode*) exit 1;; esac\nexit 0\n'


def test_a_dangling_ledger_symlink_is_refused_and_its_target_never_made(tmp_path: Path) -> None:
    script(tmp_path, FAILS_WITH_MMA)
    runs, target = tmp_path / "runs", tmp_path / "elsewhere" / "planted.sqlite"
    runs.mkdir()
    target.parent.mkdir()
    (runs / "ledger.sqlite").symlink_to(target)
    done = dsv4bisect(tmp_path, "bisect", "reference-all", "--bad", "mhc-bf16,mma-decode",
                      "--out", str(runs), "--test-cmd", "./tc.sh")
    assert done.returncode == 5, done.stderr[-2000:]
    assert "is a symbolic link" in done.stderr and "hint:" in done.stderr
    assert not target.exists() and not list(target.parent.iterdir())


def test_a_resume_whose_test_directory_is_gone_is_one_error_at_once(tmp_path: Path) -> None:
    """The first trial's command stops and waits; the test kills the bisect there (SIGKILL,
    as a lost machine would), deletes the directory the command ran in, and resumes."""
    home = tmp_path / "checkout"
    script(home, f'echo $$ > {tmp_path}/waiting\nexec sleep 600\n')
    runs = tmp_path / "runs"
    env = {**os.environ, "DSV4BISECT_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "dsv4bisect", "bisect", "reference-all",
                             "--bad", "mhc-bf16,mma-decode", "--out", str(runs),
                             "--test-cmd", "./tc.sh"], cwd=home, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    waiting = tmp_path / "waiting"
    deadline = time.monotonic() + 200
    while not (waiting.exists() and waiting.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, "no trial started"
        time.sleep(0.1)
    proc.kill()
    proc.wait(30)
    os.kill(int(waiting.read_text()), signal.SIGKILL)  # the trial's sleep, in its own session
    shutil.rmtree(home)
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    trials_before = _trials(runs / "ledger.sqlite")
    resumed = dsv4bisect(tmp_path, "bisect", "--resume", str(run_dir))
    assert resumed.returncode == 5, resumed.stderr[-2000:]
    assert f"`{home}`, which no longer exists" in resumed.stderr and "hint:" in resumed.stderr
    assert _trials(runs / "ledger.sqlite") == trials_before  # no trial ran


def _trials(ledger: Path) -> int:
    with sqlite3.connect(ledger) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0])
