"""What the search observes: a subset of candidates and its outcome."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # cannot test: never evidence; the subset is routed around (git bisect skip)
    BETWEEN = "between"  # a sequential probe at its cap: neither like the good nor the bad end


@dataclass(frozen=True)
class Record:
    """One trial as the search sees it: the candidates switched to their bad-end state."""

    subset: frozenset[str]
    outcome: Outcome
