"""What the search observes: a subset of candidates, the verdict it counts, and the rates it
holds to."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.probe import verdict as V


@dataclass(frozen=True)
class Record:
    """One trial as the search sees it: the candidates switched to their bad-end state, the
    verdict it counts (probe/verdict.py's words: PASS, FAIL, BETWEEN (a sequential probe at its
    cap: evidence for neither end, some for `unexplained`; never a pass; the subset may be
    tested again) or CANNOT_TEST (never evidence; the subset is routed around, git bisect's
    skip)), and the error rates its verdict holds to (None: the search's own)."""

    subset: frozenset[str]
    outcome: str
    noise: Noise | None = None

    @property
    def evidence(self) -> bool:
        """Whether the outcome speaks for one end (PASS or FAIL)."""
        return self.outcome in (V.PASS, V.FAIL)
