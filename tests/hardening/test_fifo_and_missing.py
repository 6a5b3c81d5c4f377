"""Readers refuse what is not a regular file, and a finished run without its verdict is not
reported as done (issue 30, items 5 and 8). A FIFO named `run.json` anywhere under a runs root
used to hang every `run`, `bisect` and `--resume` there; `report` hung on a FIFO `verdict.json`
or `<arm>/config.json`, and printed DONE (exit 0) for a run whose verdict.json was deleted."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_inproc import cli

from dsv4bisect.base.bounded import load_json
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.run.record import reconcile_abandoned


@pytest.fixture
def alarm() -> Iterator[None]:
    """A hang fails the test instead of stalling the suite."""
    def hung(signum: int, frame: object) -> None:
        raise AssertionError("hung on a FIFO")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _run_dir(root: Path) -> Path:
    run = root / "run"
    (run / "candidate").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"schema": "dsv4bisect.run/1", "status": "done",
                                              "verdict": "PASS", "profile": "reference-all"}))
    (run / "verdict.json").write_text(json.dumps(Verdict("PASS", ("fine",), {"tier": "ci"})
                                                 .to_dict()))
    return run


def test_the_loader_refuses_a_fifo_at_once(tmp_path: Path, alarm: None) -> None:
    os.mkfifo(tmp_path / "x.json")
    with pytest.raises(ConfigError, match="not a regular file \\(a FIFO\\)"):
        load_json(tmp_path / "x.json", "run")
    with pytest.raises(ConfigError, match="directory"):
        load_json(tmp_path, "run")


def test_a_fifo_run_json_does_not_hang_the_reconciliation(tmp_path: Path, alarm: None) -> None:
    (tmp_path / "old").mkdir()
    os.mkfifo(tmp_path / "old" / "run.json")
    (tmp_path / "b" / "trials" / "t1" / "c").mkdir(parents=True)
    os.mkfifo(tmp_path / "b" / "trials" / "t1" / "c" / "run.json")
    assert reconcile_abandoned(tmp_path) == []


@pytest.mark.parametrize("name", ["verdict.json", "candidate/config.json", "run.json"])
def test_report_refuses_a_fifo(tmp_path: Path, name: str, alarm: None) -> None:
    run = _run_dir(tmp_path)
    (run / name).unlink(missing_ok=True)
    os.mkfifo(run / name)
    for flags in ((), ("--json",), ("--format", "md")):
        result = cli("report", str(run), *flags)
        result.assert_error()


def test_report_on_a_finished_run_without_its_verdict_is_an_error(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    assert cli("report", str(run)).code == 0
    (run / "verdict.json").unlink()
    for flags in ((), ("--json",), ("--format", "md")):
        result = cli("report", str(run), *flags)
        result.assert_error()
        assert "verdict.json is missing" in result.err and "DONE" not in result.out


def test_a_running_or_interrupted_run_without_a_verdict_still_reports(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "verdict.json").unlink()
    for status in ("running", "interrupted"):
        (run / "run.json").write_text(json.dumps({"schema": "dsv4bisect.run/1",
                                                  "status": status, "verdict": None}))
        result = cli("report", str(run))
        assert result.code == 0 and status.upper() in result.out
