"""What a report shows of a run, as read from its run directory (`run_report.load_run`); apart
from run_report.py so that commands.py, which run_report.py imports, can take it too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4bisect.probe.verdict import Verdict


@dataclass(frozen=True)
class RunView:
    """Everything a report shows, as read from a run directory."""

    run_dir: Path
    run: dict[str, Any]
    verdict: Verdict | None  # None while running, or when interrupted before a verdict
    configs: dict[str, dict[str, Any]]  # arm -> config.json (what was resolved)
    secrets: frozenset[str] = frozenset()  # found in the unredacted files: hidden in every output

    @property
    def status(self) -> str:
        return str(self.run.get("status", "unknown"))
