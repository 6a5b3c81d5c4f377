"""Ctrl-C and SIGTERM stop every engine of a run (checked by PID), keep what exists, exit 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from run_helpers import engine_pids, load

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _start(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    runs = tmp_path / "runs"
    env = {**os.environ, "DSV4BISECT_CACHE": str(tmp_path / "cache"), "NO_COLOR": "1"}
    # stderr to a file: a pipe nobody reads while the test waits could fill and stall the run.
    with open(tmp_path / "stderr.log", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "dsv4bisect", "run", "reference",
                                 "--tier", "ci", "--out", str(runs)], env=env,
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
    return proc, runs


def _stderr(proc: subprocess.Popen[str]) -> str:
    path = Path(proc.args[-1]).parent / "stderr.log"  # type: ignore[index]
    return path.read_text() if path.exists() else ""


def _wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen[str],
              timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"run ended before {what}:\n{_stderr(proc)}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{_stderr(proc)}"
        time.sleep(0.1)


def _run_dir(runs: Path) -> Path | None:
    dirs = [d for d in runs.glob("*") if d.is_dir()] if runs.exists() else []
    return dirs[0] if dirs else None


def _described(pids: set[int]) -> str:
    """Each PID's state, parent and command line (what survived, for the failure message)."""
    out = []
    for pid in sorted(pids):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            out.append(f"{pid} (state {stat[0]}, parent {stat[1]}): {cmd[:160]}")
        except OSError:
            out.append(f"{pid} (gone)")
    return "; ".join(out)


def _interrupt_and_check(proc: subprocess.Popen[str], run_dir: Path, sig: int) -> None:
    pids = engine_pids(run_dir)
    assert pids, "no engine process was found for the run"
    proc.send_signal(sig)
    proc.wait(timeout=120)
    err = _stderr(proc)
    assert proc.returncode == 130, err
    assert "interrupted" in err, err
    # Survivors are this run's processes (their environment names its receipts directory), not
    # merely live PIDs: under a loaded machine's process churn a reaped engine's PID can be
    # another process's a moment later.
    deadline = time.monotonic() + 5  # init reaps the killed engines
    while pids & engine_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = pids & engine_pids(run_dir)
    assert not left, f"engine processes survived the interrupt: {_described(left)}\n{err}"
    assert not engine_pids(run_dir), err
    doc = load(run_dir / "run.json")
    assert doc["status"] == "interrupted" and doc["exit_code"] == 130, err


def test_ctrl_c_while_the_engines_start_leaves_no_engine(tmp_path: Path) -> None:
    proc, runs = _start(tmp_path)
    try:
        _wait_for("the engines to be spawned",
                  lambda: (d := _run_dir(runs)) is not None and len(engine_pids(d)) >= 2, proc)
        run_dir = _run_dir(runs)
        assert run_dir is not None
        log = run_dir / "baseline/logs/server.log"
        assert "ready:" not in (log.read_text() if log.exists() else "")  # still starting
        _interrupt_and_check(proc, run_dir, signal.SIGINT)
    finally:
        proc.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_while_probing_leaves_no_engine_and_keeps_the_run_dir(tmp_path: Path,
                                                                        sig: int) -> None:
    proc, runs = _start(tmp_path)
    try:
        def probing() -> bool:
            d = _run_dir(runs)
            log = d / "baseline/logs/server.log" if d else None
            return bool(log and log.exists() and "POST /v1/chat/completions" in log.read_text())

        _wait_for("the probe to start", probing, proc)
        run_dir = _run_dir(runs)
        assert run_dir is not None
        _interrupt_and_check(proc, run_dir, sig)
        assert (run_dir / "baseline/config.json").exists()
        assert (run_dir / "candidate/config.json").exists()
    finally:
        proc.kill()
