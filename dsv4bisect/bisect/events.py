"""What the driver reports while it runs (for the live display) and the result as JSON."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4bisect.bisect.search.results import SearchResult
from dsv4bisect.bisect.trials.runner import TrialResult
from dsv4bisect.probe import verdict as V

if TYPE_CHECKING:
    from dsv4bisect.bisect.search.search import Search


@dataclass(frozen=True)
class TrialStarted:
    step: int
    subset: frozenset[str]
    patches: dict[str, str]
    seed_block: int
    attempt: int
    trial_dir: Path
    remedy: bool = False  # a remedy-check trial (after the search), not a search step
    confirmation: bool = False  # the fresh-launch confirmation (after the search)


@dataclass(frozen=True)
class TrialFinished:
    """One attempt ran (a CANNOT_TEST attempt is followed by a retry)."""

    step: int
    subset: frozenset[str]
    seed_block: int
    attempt: int
    result: TrialResult
    remedy: bool = False
    confirmation: bool = False


@dataclass(frozen=True)
class StepDecided:
    """The outcome the search records for a step; `reused` = taken from the ledger."""

    step: int
    subset: frozenset[str]
    seed_block: int
    outcome: str
    signature: str | None
    reused: bool
    remedy: bool = False
    confirmation: bool = False


@dataclass(frozen=True)
class Progress:
    trials_used: int
    phase: str  # ends | search | confirm | done
    top: tuple[tuple[str, float], ...]  # the five likeliest hypotheses with their posterior
    remaining: int  # estimated trials still needed


Event = TrialStarted | TrialFinished | StepDecided | Progress


def result_json(result: SearchResult) -> dict[str, Any]:
    """The stable JSON form of a search result (stored with the run; the report reads it)."""
    return {
        "status": result.status.value,
        "culprits": sorted(result.culprits) if result.culprits is not None else None,
        "posterior": result.posterior,
        "top": [
            {
                "hypothesis": h.describe(),
                "kind": h.kind,
                "members": sorted(h.members),
                "posterior": p,
            }
            for h, p in result.top
        ],
        "checks": [
            {
                "config": sorted(c.config),
                "member": c.member,
                "expect": V.SEARCH_WORDS[c.expect],
                "log10_ratio": c.log10_ratio,
                "fresh_log10_ratio": c.fresh_log10_ratio,
                "trials": c.trials,
                "confirmed": c.confirmed,
            }
            for c in result.checks
        ],
        "trials_used": result.trials_used,
        "message": result.message,
    }


def progress_of(search: Search) -> Progress:
    """The live state of a search, for the display."""
    return Progress(
        trials_used=search.trials_used,
        phase=search.phase,
        top=tuple((h.describe(), p) for h, p in search.top(5)),
        remaining=search.remaining(),
    )
