"""What a run tells its display while it works (the CLI renders these on stderr).

Events may come from two threads at once (the A/A repeat runs beside the candidate on the
embedded engine); a display must be thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dsv4bisect.probe.runner import ProbeProgress


@dataclass(frozen=True)
class EngineEvent:
    """A process of an arm changed state, or printed a new last log line while starting."""

    arm: str  # baseline | candidate
    attempt: int
    role: str
    state: str  # starting | ready | exited | stopped
    line: str  # last log line (secrets redacted)


@dataclass(frozen=True)
class ProbeEvent:
    """Progress of one probe stage: `baseline`, `A/A repeat` or `candidate`."""

    stage: str
    progress: ProbeProgress


@dataclass(frozen=True)
class Notice:
    """A sentence worth showing (cache reuse, a crash being retried, the run directory)."""

    text: str
    level: str = "info"  # info | warn
    run_dir: str | None = None  # set on the notice that announces the run directory


RunEvent = EngineEvent | ProbeEvent | Notice
EventSink = Callable[[RunEvent], None]


def ignore(_event: RunEvent) -> None:
    """The sink used when nobody listens."""
