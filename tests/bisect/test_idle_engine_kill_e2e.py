"""A real embedded engine kept up between trials, killed from outside while idle mid-bisect, is
relaunched: the bisect names the same culprit as an undisturbed one (issue 40, item 1).

The bisect is the CLI in its own process, as a user runs it (the single-culprit question of
tests/bisect/test_bisect_e2e.py). Between two rounds (a search step just decided, no trial
running) the bisect is paused with SIGSTOP, its engine killed with SIGKILL, and the bisect
continued: the next trial that needs the engine finds it gone, relaunches it, and the report
counts the relaunch and says why."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bisect.test_bisect_e2e import SINGLE, alive, bisect, engine_pids, env, ledger_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3000)]


STEP = re.compile(r"^step (\d+): .* -> ")  # the display's line once a search step is decided


def _kill_engine_between_rounds(proc: subprocess.Popen[str], runs: Path, after: int
                                ) -> tuple[int, list[str]]:
    """At the first search step >= `after` decided with no trial running (the display prints
    the step's line right after the ledger records it, before the next round is proposed):
    pause the bisect, SIGKILL its engine (the process it launched), continue it. Returns the
    engine's pid and the stderr lines read so far."""
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        m = STEP.match(line.strip())
        if not m or int(m.group(1)) < after:
            continue
        os.kill(proc.pid, signal.SIGSTOP)
        run_dir = next(runs.glob("*-bisect-*"))
        engines = [p for p in engine_pids(run_dir)
                   if Path(f"/proc/{p}/stat").read_text().split()[3] == str(proc.pid)]
        if engines and not any(r["status"] == "running" for r in ledger_rows(runs)):
            os.kill(engines[0], signal.SIGKILL)
            while alive(engines[0]):  # a zombie until the bisect reaps it
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGCONT)
            return engines[0], seen
        os.kill(proc.pid, signal.SIGCONT)  # the next trial had started: the next step
    raise AssertionError("no idle moment between rounds:\n" + "".join(seen))


def test_an_engine_killed_idle_mid_bisect_is_relaunched_and_the_culprit_stands(
        cli, tmp_path: Path) -> None:
    for sub in ("plain", "killed"):
        (tmp_path / sub).mkdir()
    plain, wall_plain = bisect(cli, tmp_path / "plain", *SINGLE)
    assert plain.returncode == 0, plain.stderr
    undisturbed = json.loads(plain.stdout)

    runs = tmp_path / "killed" / "runs"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "dsv4bisect", "bisect", *SINGLE, "--json",
                             "--out", str(runs)], env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        killed, before = _kill_engine_between_rounds(proc, runs, after=1)
        out, rest = proc.communicate(timeout=1800)
        err = "".join(before) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
    wall_killed = time.monotonic() - t0
    assert proc.returncode == 0, err
    report = json.loads(out)
    print(f"undisturbed: {undisturbed['culprits']} in {wall_plain:.0f} s, "
          f"{undisturbed['bound']['launches']} trials launched; killed idle (pid {killed}): "
          f"{report['culprits']} in {wall_killed:.0f} s, "
          f"{report['bound']['launches']} trials launched, relaunches {report['relaunches']}")
    assert report["culprits"] == undisturbed["culprits"] == ["hash-topk-scaling"]
    assert report["status"] == undisturbed["status"] == "found"
    assert report["relaunches"]["count"] == 1 and report["bound"]["relaunches"] == 1
    assert "killed by SIGKILL, which dsv4bisect did not send" in report["relaunches"]["why"][0]
    assert "relaunching it" in err  # said while it happened
    rows = ledger_rows(runs)
    assert not [r for r in rows if r["verdict"] == "CANNOT_TEST"]  # no trial was lost to it
    assert sum("killed by SIGKILL" in w for r in rows
               for w in json.loads(r["details"]).get("relaunched", [])) == 1
    run_dir = Path(report["run_dir"])
    assert "1 engine(s) kept up between trials were found unable to serve and relaunched" in \
        (run_dir / "report.md").read_text()
    assert not engine_pids(run_dir)
