"""End to end with real processes: a `--test-cmd` bisect killed with SIGKILL mid-trial, resumed,
gets the same answer and repeats no finished trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from dsv4bisect.bisect.driver import RUN_FILE
from dsv4bisect.bisect.ledger import Ledger

HERE = Path(__file__).parent
CULPRITS = "mma-decode,triton-indexer"  # an interaction: fails only when both are on


def bisect(mode: str, tmp_path: Path, log: Path, delay: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "bisect_proc.py"),
            mode,
            str(tmp_path / "run"),
            str(tmp_path / "ledger.sqlite"),
            str(log),
            CULPRITS,
            str(delay),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def starts(log: Path) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [
        tuple(line.split()[1:3])
        for line in log.read_text().splitlines()
        if line.startswith("start")
    ]


@pytest.mark.timeout(180)
def test_sigkill_mid_run_then_resume_repeats_no_finished_trial(tmp_path):
    log = tmp_path / "invocations.log"
    proc = bisect("start", tmp_path, log, delay=0.4)
    deadline = time.monotonic() + 120
    while len(starts(log)) < 4:  # the fourth trial is running: three are finished
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.6)  # the orphaned check finishes on its own, as it would in real life

    run_id = json.loads((tmp_path / "run" / RUN_FILE).read_text())["run_id"]
    with Ledger.open_readonly(tmp_path / "ledger.sqlite") as ledger:  # a writer would
        rows = ledger.trials(run_id)  # reconcile the `running` row at once
    done_before = {
        (json.dumps(r.patches, sort_keys=True), r.key.seed_block)
        for r in rows
        if r.status == "done"
    }
    assert len(done_before) == 3 and Counter(r.status for r in rows)["running"] == 1

    resumed = bisect("resume", tmp_path, log, delay=0.0)
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    result = json.loads(out)
    assert result["status"] == "found"
    assert result["culprits"] == sorted(CULPRITS.split(","))

    calls = Counter(starts(log))
    finished_keys = [k for k, n in calls.items() if n > 1]
    assert len(finished_keys) == 1  # only the trial killed mid-run ran twice
    assert sum(calls.values()) == result["trials_run"] + 4  # 3 finished + 1 killed, then resume

    reference_log = tmp_path / "reference.log"
    (tmp_path / "ref").mkdir()
    ref = subprocess.run(
        [
            sys.executable,
            str(HERE / "bisect_proc.py"),
            "start",
            str(tmp_path / "ref" / "run"),
            str(tmp_path / "ref" / "ledger.sqlite"),
            str(reference_log),
            CULPRITS,
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(ref.stdout)["culprits"] == result["culprits"]
    assert sorted(starts(reference_log)) == sorted(set(starts(log)))  # the same trials
