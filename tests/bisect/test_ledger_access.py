"""One writer per ledger, and readers that never write: real processes, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4bisect.bisect.ledger import Ledger, TrialKey
from dsv4bisect.errors import BisectError

HERE = Path(__file__).parent
CHECK = HERE / "fake_check.py"

HOLD = """
import sys, time
from dsv4bisect.bisect.ledger import Ledger
ledger = Ledger.open(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def _hold(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder_until_it_dies(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    holder = _hold(path)
    try:
        with pytest.raises(BisectError) as info:
            Ledger.open(path)
        assert f"in use by another bisect (PID {holder.pid})" in info.value.message
        assert info.value.hint and "--ledger" in info.value.hint
        with Ledger.open_readonly(path) as reader:  # readers are never refused
            assert reader.trials("nope") == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with Ledger.open(path) as ledger:  # kill -9 leaves no stale lock
        assert ledger.journal_mode == "wal"


def test_a_writer_in_the_same_process_is_refused_too(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite"):
        with pytest.raises(BisectError, match=f"PID {os.getpid()}"):
            Ledger.open(tmp_path / "l.sqlite")
    Ledger.open(tmp_path / "l.sqlite").close()  # released on close


def test_running_rows_of_a_dead_driver_are_reconciled_when_the_lock_is_taken(
        tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger.open(path) as ledger:
        run = ledger.create_run(tmp_path, {})
        trial = ledger.start_trial(run, 0, TrialKey("f", "p", 0), 1, {}, frozenset(), "d")
    # The writer is gone (closed here; killed in real life): its row still says running ...
    with Ledger.open_readonly(path) as reader:
        assert reader.trial(trial).status == "running"
    # ... until the next writer holds the lock, which proves no driver is alive.
    with Ledger.open(path) as ledger:
        assert ledger.reconciled == 1 and ledger.trial(trial).status == "abandoned"


def test_a_reader_creates_no_file(tmp_path: Path) -> None:
    missing = tmp_path / "ledger.sqlite"
    with pytest.raises(BisectError, match="does not exist"):
        Ledger.open_readonly(missing)
    assert list(tmp_path.iterdir()) == []
    with Ledger.open(missing) as ledger:
        ledger.create_run(tmp_path, {})
    before = sorted(p.name for p in tmp_path.iterdir())
    with Ledger.open_readonly(missing) as reader:
        assert reader.trials("x") == []
        with pytest.raises(Exception):  # noqa: B017 - sqlite refuses the write itself
            reader.create_run(tmp_path, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_reader_sees_what_a_live_writer_committed(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger.open(path) as writer:
        run = writer.create_run(tmp_path, {"x": 1})
        with Ledger.open_readonly(path) as reader:
            assert reader.get_run(run).settings == {"x": 1}


def test_two_bisects_on_one_ledger_the_second_is_refused_with_the_holders_pid(
        cli, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    log = tmp_path / "calls.log"
    check = f"{sys.executable} {CHECK} {log} mma-decode"
    env = {**os.environ, "NO_COLOR": "1", "FAKE_CHECK_DELAY": "60"}
    with open(tmp_path / "first.err", "w") as err:
        first = subprocess.Popen([sys.executable, "-m", "dsv4bisect", "bisect", "--test-cmd",
                                  check, "--out", str(runs)], cwd=tmp_path, env=env,
                                 stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and "start" in log.read_text()):  # a trial runs: lock held
            assert first.poll() is None, (tmp_path / "first.err").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run_dir = next(runs.glob("*-bisect-*"))
        for args in (("bisect", "--test-cmd", check, "--out", runs),
                     ("bisect", "--resume", run_dir)):
            r = cli(*args, cwd=tmp_path)
            assert r.returncode == 5, r.stderr
            lines = r.stderr.strip().splitlines()
            assert lines[-2].startswith("error:") and f"PID {first.pid}" in lines[-2], r.stderr
            assert lines[-1].startswith("hint:") and "Traceback" not in r.stderr
        assert log.read_text().count("start") == 1  # nobody ran the same trial twice
        assert list(runs.glob("*-bisect-*")) == [run_dir]  # the refused one wrote nothing
    finally:
        first.kill()
        first.wait()


def test_report_on_a_bisect_whose_ledger_is_missing_creates_nothing(cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "bisect-run"
    run_dir.mkdir()
    ledger = tmp_path / "gone" / "ledger.sqlite"
    (run_dir / "bisect.json").write_text(json.dumps({"run_id": "r1", "ledger": str(ledger)}))
    r = cli("report", run_dir, cwd=tmp_path)
    assert r.returncode == 5, r.stderr
    assert "does not exist" in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr
    assert not ledger.exists() and not ledger.parent.exists()
    assert sorted(p.name for p in run_dir.iterdir()) == ["bisect.json"]
