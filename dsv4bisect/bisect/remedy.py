"""The remedy check: does the bad end pass once the culprit set is switched off?

The search's model has one culprit set (a configuration fails iff it contains the set). Two
independent culprits break that model without contradicting it: the search names one of them,
and every trial it ran can agree. What the user needs next is the configuration they would ship:
the bad end without the culprit set. The driver runs it after the search (it is not one of the
search's records, so it moves no posterior and spends none of `--max-trials`): once when it
passes, a second time with a fresh seed block when it fails (one FAIL can be the probe's false
fail). Two FAILs: another culprit remains; the report says so and how to bisect the rest.
Trials the search already ran on that configuration count first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dsv4bisect.bisect.search.records import Record
from dsv4bisect.probe import verdict as V

MAX_TRIALS = 2

PASSES = "passes"  # the bad end without the culprits passes: the culprit set explains it all
FAILS = "fails"  # it failed twice: another culprit remains
MIXED = "mixed"  # one pass, one fail: inside the probe's noise
UNTESTED = "untested"  # cannot test, or nothing to remove


@dataclass(frozen=True)
class Remedy:
    subset: frozenset[str]  # the candidates that stay switched to the bad end
    outcomes: tuple[str, ...]  # search records of that subset first, then the check's own
    trials_run: int  # trials the check itself needed (0 when the search had tested it)

    @property
    def verdict(self) -> str:
        seen = [o for o in self.outcomes if o in (V.PASS, V.FAIL)]  # BETWEEN and
        # SKIP say nothing about it
        if not seen:
            return UNTESTED
        if V.PASS in seen and V.FAIL in seen:
            return MIXED
        return PASSES if seen[0] == V.PASS else FAILS

    def to_json(self) -> dict[str, Any]:
        return {"subset": sorted(self.subset), "verdict": self.verdict,
                "outcomes": [V.SEARCH_WORDS[o] for o in self.outcomes],
                "trials_run": self.trials_run}


def remedy_subset(candidates: Sequence[str], culprits: frozenset[str] | None) -> frozenset[str]:
    """The bad end without the culprits (empty when there is nothing to check)."""
    if not culprits:
        return frozenset()
    return frozenset(candidates) - culprits


def needs_more(outcomes: Sequence[str], own_trials: int) -> bool:
    """Whether the check runs another trial: no PASS yet, fewer than two FAILs, and fewer than
    `MAX_TRIALS` of its own (a configuration that cannot be tested is not retried forever)."""
    if own_trials >= MAX_TRIALS or V.PASS in outcomes:
        return False
    return sum(o == V.FAIL for o in outcomes) < MAX_TRIALS


def prior_outcomes(records: Sequence[Record], subset: frozenset[str]) -> list[str]:
    """What the search already measured on `subset` (in order)."""
    return [r.outcome for r in records if r.subset == subset]


def simulate(candidates: Sequence[str], culprits: frozenset[str] | None,
             records: Sequence[Record], run: Callable[[frozenset[str]], str]) -> None:
    """The remedy check as the driver runs it, for a simulated bisect (`--plan`): the search's
    own outcomes of the remedy subset, then `run(subset)` until they decide."""
    subset = remedy_subset(candidates, culprits)
    outcomes = prior_outcomes(records, subset)
    own = 0
    while subset and needs_more(outcomes, own):
        outcomes.append(run(subset))
        own += 1
