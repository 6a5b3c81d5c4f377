"""What a search concludes: a status, the top hypotheses, the checks, and a sentence."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from dsv4bisect.bisect.search.confirm import Check
from dsv4bisect.bisect.search.hypotheses import (
    BAD_END_PASSES,
    GOOD_END_FAILS,
    UNEXPLAINED,
    Hypothesis,
)


class Status(str, Enum):
    RUNNING = "running"
    FOUND = "found"
    # several patches each fail alone (the good end passed every time): culprits names them all
    SEVERAL = "several"
    GOOD_END_FAILS = GOOD_END_FAILS  # the good end fails too: not the candidates
    BAD_END_PASSES = BAD_END_PASSES  # the bad end passes: the failure does not reproduce
    UNEXPLAINED = UNEXPLAINED  # ends differ, but no culprit set up to max_order explains it
    BUDGET = "budget"  # max_trials spent before the confidence was reached
    UNTESTABLE = "untestable"  # every informative subset was skipped


@dataclass(frozen=True)
class SearchResult:
    status: Status
    culprits: frozenset[str] | None  # the top culprit set (the answer when status is FOUND)
    posterior: float  # of the top hypothesis
    top: tuple[tuple[Hypothesis, float], ...]
    checks: tuple[Check, ...]  # minimality (or end) checks of the top hypothesis
    trials_used: int
    message: str


def describe(status: Status, hyp: Hypothesis, p: float,
             several: frozenset[str] = frozenset()) -> str:
    """One sentence for the user about where the search stands."""
    messages = {
        Status.SEVERAL: "several culprits, each failing on its own: " + ", ".join(sorted(several))
        + " (the good end passed every time it was measured)",
        Status.FOUND: f"culprit {hyp.describe()} (posterior {p:.3f}), each member needed",
        Status.GOOD_END_FAILS: "the good end fails too: the failure does not come from the "
        "candidates",
        Status.BAD_END_PASSES: "the bad end passes: the failure does not reproduce with these "
        "candidates",
        Status.UNEXPLAINED: "no culprit set up to max_order explains the outcomes "
        "(try max_order=3)",
        Status.BUDGET: f"budget spent; best guess {hyp.describe()} at posterior {p:.3f}",
        Status.UNTESTABLE: f"no testable subset left; best guess {hyp.describe()} at {p:.3f}",
    }
    return messages.get(status, f"running; leading {hyp.describe()} at {p:.3f}")
