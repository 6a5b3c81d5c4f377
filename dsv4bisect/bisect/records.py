"""What the search observes: a subset of candidates, its outcome, and the rates it holds to."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from dsv4bisect.bisect.design import Noise


class Outcome(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # cannot test: never evidence; the subset is routed around (git bisect skip)
    # A sequential probe at its cap: like neither the good nor the bad end. Evidence for neither
    # end (the same likelihood under every culprit set and end catch-all), some evidence for
    # `unexplained`; never a pass. The subset may be tested again (the next seed block).
    BETWEEN = "between"


@dataclass(frozen=True)
class Record:
    """One trial as the search sees it: the candidates switched to their bad-end state, and the
    error rates its verdict holds to (None: the search's own)."""

    subset: frozenset[str]
    outcome: Outcome
    noise: Noise | None = None

    @property
    def evidence(self) -> bool:
        """Whether the outcome speaks for one end (PASS or FAIL)."""
        return self.outcome in (Outcome.PASS, Outcome.FAIL)
