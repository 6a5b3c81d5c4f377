"""A bisect's directory read after its runs root was copied or moved: its report finds the
ledger beside it, as `localise` does (bisect/ledger.py `open_holding`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dsv4bisect.bisect.driver import read_run_file
from dsv4bisect.bisect.report import load_bisect
from dsv4bisect.errors import BisectError

KEPT = Path(__file__).resolve().parents[1] / "localise" / "data" / "bisect-scale-layout"


def test_a_copied_runs_root_is_read_from_the_ledger_beside_it(tmp_path: Path) -> None:
    shutil.copytree(KEPT, tmp_path / "runs")
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if (p / "bisect.json").is_file())
    beside = tmp_path / "runs" / "ledger.sqlite"
    recorded = Path(read_run_file(run_dir)["ledger"])  # where the bisect ran, elsewhere
    assert recorded != beside
    view = load_bisect(run_dir)
    assert view.ledger == str(beside) and view.steps and view.result["status"] == "found"
    beside.unlink()
    if not recorded.is_file():  # nowhere else: one error that says what to do
        with pytest.raises(BisectError, match="does not exist") as err:
            load_bisect(run_dir)
        assert "keep it beside the run directory" in str(err.value.hint)
