"""The server that answers is the one launched, and a `kill -9`ed run leaves no engine behind.

Real processes throughout: a foreign `dsv4bisect serve` holds the port of a profile; a real
`dsv4bisect run` is killed with SIGKILL while its engines run, and the next `run` on the same
runs root must stop them (found by PID and start time in the run directory, never by port).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from run_helpers import SERVE_ARGS, alive, cli, command_profile, engine_pids, load

from dsv4bisect.engines.launcher import free_port
from dsv4bisect.engines.ports import port_holder

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _wait(what: str, check: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_port_held_by_a_foreign_server_is_cannot_test_with_the_holder_named(
        tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    args = [a.format(host="127.0.0.1", port=port) for a in SERVE_ARGS]
    log = tmp_path / "foreign.log"
    with open(log, "w") as out:
        foreign = subprocess.Popen([sys.executable, "-m", "dsv4bisect", "serve", *args],
                                   stdout=out, stderr=subprocess.STDOUT)
    cache = tmp_path / "cache"
    try:
        _wait("the foreign server to bind", lambda: port_holder("127.0.0.1", port) is not None)
        runs = tmp_path / "runs"
        r = cli("run", "reference", "--tier", "ci", "--out", runs, "--json",
                "--set", f"engine.port={port}", cache=cache)
        assert r.returncode == 125 and f"port {port} is held by PID {foreign.pid}" in r.stderr
        assert not runs.exists()  # the preflight answered before anything was made
        # past the preflight, the launcher's own check holds the line
        for extra in ((), ("--enable", "mma-decode", "--no-cache")):
            r = cli("run", "reference", "--tier", "ci", "--out", runs, "--json", "--skip-preflight",
                    "--set", f"engine.port={port}", *extra, cache=cache)
            assert r.returncode == 125, r.stderr  # never PASS, never "did not take effect" (5)
            v = json.loads(r.stdout)
            assert v["verdict"] == "CANNOT_TEST"
            assert f"port {port} is held by PID {foreign.pid}" in v["reasons"][0]
            assert "dsv4bisect serve" in v["reasons"][0] and "before launch" in v["reasons"][0]
        assert "POST" not in log.read_text()  # the foreign server was never probed
        assert not (cache / "baselines").exists() or not list((cache / "baselines").iterdir())
        for run_dir in runs.iterdir():
            assert not (run_dir / "baseline" / "rows.jsonl").exists()
    finally:
        foreign.kill()
        foreign.wait()


def _spawned(record: Path) -> bool:
    """Every entry of an engines.json holds its PID (each is written just before its spawn,
    in state `spawning`, and gets the PID right after)."""
    groups = json.loads(record.read_text())["groups"]
    return bool(groups) and all(g.get("pid") for g in groups)


@pytest.mark.parametrize("nxt", ["run", "bisect"])
def test_kill_9_of_run_leaves_no_engine_once_the_next_run_starts(tmp_path: Path,
                                                                 nxt: str) -> None:
    runs = tmp_path / "runs"
    env = {**os.environ, "DSV4BISECT_CACHE": str(tmp_path / "cache"), "NO_COLOR": "1"}
    with open(tmp_path / "first.log", "w") as err:
        first = subprocess.Popen([sys.executable, "-m", "dsv4bisect", "run", "reference",
                                  "--tier", "ci", "--out", str(runs)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=err)
    try:
        def both_recorded() -> bool:
            assert first.poll() is None, (tmp_path / "first.log").read_text()
            recs = list(runs.glob("*/*/engines.json")) if runs.exists() else []
            return len(recs) == 2 and all(_spawned(r) for r in recs)

        _wait("both engines to be recorded", both_recorded)
        run_dir = next(runs.iterdir())
        pids = engine_pids(run_dir)
        assert len(pids) >= 2
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert all(alive(p) for p in pids)  # orphans: nothing stopped them (yet)
        assert load(run_dir / "run.json")["status"] == "running"

        # The next run (or bisect) on the same root, one that ends quickly: an engine that is
        # never ready; a bisect whose test command passes everywhere (the ends do not differ).
        if nxt == "run":
            never = command_profile(tmp_path, "never", [sys.executable, "-m", "http.server",
                                                        "{port}", "--bind", "127.0.0.1"],
                                    ready="/health", timeout=1)
            r = cli("run", never, "--tier", "ci", "--out", runs, cache=tmp_path / "cache")
            assert r.returncode == 125, r.stderr
        else:
            r = cli("bisect", "--test-cmd", "true", "--max-trials", "2", "--out", runs,
                    cache=tmp_path / "cache")
            assert r.returncode == 1, r.stderr
        assert "left running by a killed dsv4bisect" in r.stderr
        assert f"{run_dir} was left `running`" in r.stderr
        assert not [p for p in pids if alive(p)], r.stderr
        doc = load(run_dir / "run.json")
        assert doc["status"] == "abandoned" and doc["abandoned_at"]
    finally:
        first.kill()
        for pid in engine_pids(tmp_path):  # only if the test failed: never leave engines
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
