"""An engine kept up between trials that dies or hangs while idle is noticed and relaunched
(issue 40, item 1; bisect/trials/engine_pool.py `EnginePool.get`).

The engines are real processes: a tiny HTTP server launched as a `command` engine (its ready
path answers 200), killed from outside by SIGKILL, SIGTERM or SIGHUP, or stopped (SIGSTOP: alive
but not answering) while the pool keeps it up. The next trial that asks for it gets none, the
pool says why (`take_relaunches`, a trial's details `relaunched`), and a fresh launch serves."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4bisect.bisect.trials.engine_pool import EnginePool, HotEngine
from dsv4bisect.config.resolve import resolve
from dsv4bisect.engines import launcher
from dsv4bisect.run.arm import Supervisor
from dsv4bisect.run.events import Notice
from tests.engines.test_external_kill import SERVER, _profile

KEY = "lambda-empty"


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[tuple[EnginePool, list[object]]]:
    # A bare HTTP server with default handlers: SIGKILL, SIGTERM and SIGHUP each end it.
    cfg = resolve(_profile(tmp_path, [sys.executable, "-c", SERVER, "{port}"]))
    events: list[object] = []
    p = EnginePool(2, config=lambda patches: cfg, api_key=None, supervisor=Supervisor(),
                   on_event=events.append)
    try:
        yield p, events
    finally:
        p.close()


def _up(p: EnginePool, tmp_path: Path, n: int) -> HotEngine:
    """An engine launched, ready and kept up under KEY, as the hot runner does."""
    cfg = p.config({})
    eng = p.new("hot", {}, cfg, tmp_path / f"engine-{n}")
    eng.arm.ready()
    p.add(KEY, eng)
    return eng


def _pid(eng: HotEngine) -> int:
    assert eng.arm.launch is not None
    return int(eng.arm.launch.procs[0].popen.pid)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_healthy_engine_kept_up_is_used_again(pool, tmp_path: Path) -> None:
    p, events = pool
    eng = _up(p, tmp_path, 0)
    assert p.get(KEY) is eng and p.take_relaunches() == []
    assert not [e for e in events if isinstance(e, Notice)]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_an_engine_killed_idle_is_dropped_counted_and_relaunched(pool, tmp_path: Path,
                                                                 sig: int) -> None:
    p, events = pool
    eng = _up(p, tmp_path, 0)
    pid = _pid(eng)
    os.kill(pid, sig)
    assert eng.arm.launch is not None
    eng.arm.launch.procs[0].popen.wait(timeout=60)  # dead while the pool keeps it up

    assert p.get(KEY) is None  # the trial that comes back to it launches another
    assert p.up == ()
    why = p.take_relaunches()
    assert len(why) == 1 and f"killed by {signal.Signals(sig).name}" in why[0], why
    assert "which dsv4bisect did not send" in why[0]
    notes = [e.text for e in events if isinstance(e, Notice) and e.level == "warn"]
    assert any("relaunching it" in n and signal.Signals(sig).name in n for n in notes), notes
    assert p.take_relaunches() == []  # reported once

    again = _up(p, tmp_path, 1)  # the relaunch: a fresh process that serves
    assert _pid(again) != pid and p.get(KEY) is again and p.take_relaunches() == []
    assert p.launches == 2


def test_an_engine_that_hangs_idle_fails_its_health_check_and_is_stopped(
        pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alive but not answering its ready path (SIGSTOP): dropped, and its process stopped."""
    monkeypatch.setattr(launcher, "HEALTH_TIMEOUT_S", 1.0)
    monkeypatch.setattr(launcher, "GRACE_S", 1.0)  # a stopped process ignores SIGTERM
    p, _events = pool
    eng = _up(p, tmp_path, 0)
    pid = _pid(eng)
    os.kill(pid, signal.SIGSTOP)
    assert p.get(KEY) is None
    why = p.take_relaunches()
    assert len(why) == 1 and "is alive but did not answer GET /health (within 1 s)" in why[0], why
    assert _gone(pid)  # the hung engine is not left behind


def test_the_report_counts_the_relaunches_and_says_why(tmp_path: Path) -> None:
    """What the trials' details say (`relaunched`, as the hot runner writes them) is summed in
    the report: its JSON, its markdown and the terminal lines."""
    from dsv4bisect.bisect.driver import start_bisect
    from dsv4bisect.bisect.ledger import Ledger
    from dsv4bisect.bisect.report import load_bisect, render_markdown, report_json, \
        terminal_lines
    from dsv4bisect.bisect.spec import BisectSpec
    from dsv4bisect.bisect.trials.runner import TrialResult
    from dsv4bisect.probe import verdict as V
    from tests.bisect.test_bisect_driver import NOISELESS, OracleRunner

    why = "engine process `server` was killed by SIGKILL, which dsv4bisect did not send"
    names = ("mhc-bf16", "mma-decode", "triton-indexer")
    relaunched = TrialResult(V.FAIL, details={"relaunched": [why]})
    runner = OracleRunner({"mma-decode"}, verdicts={frozenset(["mma-decode"]): [relaunched]})
    spec = BisectSpec(candidates=names, good={}, bad={n: "on" for n in names}, noise=NOISELESS)
    with Ledger.open(tmp_path / "ledger.sqlite") as ledger:
        start_bisect(spec, runner, ledger, tmp_path / "run")
    view = load_bisect(tmp_path / "run")
    assert view.relaunches == (why,)
    doc = report_json(view)
    assert doc["relaunches"] == {"count": 1, "why": [why]} and doc["bound"]["relaunches"] == 1
    line = "1 engine(s) kept up between trials were found unable to serve and relaunched: " + why
    assert line in render_markdown(view)
    assert line in [text for text, _style in terminal_lines(view)]
