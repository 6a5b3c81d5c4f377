"""A sample of the damaged run directories and ledgers of `tests/benchmarks/damaged_runs.py`
(issue 30, item 12 and the corpus): `report`, `report --json` and `bisect --resume` answer each
with exit 5 (or another documented code) and a hint — never a traceback or a hang. The whole
corpus is the benchmark; this keeps one fixture of each kind of damage in the fast suite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from cli_inproc import cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import damaged_runs

SAMPLE = ["trial-verdict-garbage", "trial-details-not-json", "trial-patches-garbage",
          "runs-settings-truncated", "runs-settings-candidates-number", "steps-outcome-maybe",
          "ledger-truncated", "ledger-a-fifo", "bisect-json-ledger-number",
          "bisect-json-request-string", "bisect-json-test-cmd-number", "run-verdict-deleted",
          "run-verdict-fifo", "run-config-fifo"]


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("damaged-templates")
    env = {**os.environ, "DSV4BISECT_CACHE": str(root / "cache"), "NO_COLOR": "1"}
    return damaged_runs.make_templates(root, env)


def test_the_corpus_is_big_enough() -> None:
    assert len(damaged_runs.FIXTURES) >= 40 and set(SAMPLE) <= set(damaged_runs.FIXTURES)


@pytest.mark.parametrize("name", SAMPLE)
def test_a_damaged_directory_is_an_error_with_a_hint(name: str, templates: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    target = damaged_runs.make_fixture(name, templates, tmp_path / name)
    for command in damaged_runs.COMMANDS:
        result = cli(*(a.format(dir=target) for a in command))
        result.assert_clean()  # in time, no traceback, a documented exit code
        if result.code == 5:
            result.assert_error()  # `error:` and `hint:` lines
        # exit 0 is fine too: a resume may rebuild what the damage removed from the ledger


def test_damaged_rows_are_named(templates: tuple[Path, Path], tmp_path: Path) -> None:
    target = damaged_runs.make_fixture("trial-verdict-garbage", templates, tmp_path / "v")
    result = cli("report", str(target))
    assert "ledger table `trials`, row" in result.err and "`verdict` is not a verdict" in result.err
    target = damaged_runs.make_fixture("bisect-json-ledger-number", templates, tmp_path / "l")
    assert "`ledger` is not a non-empty string" in cli("bisect", "--resume", str(target)).err
