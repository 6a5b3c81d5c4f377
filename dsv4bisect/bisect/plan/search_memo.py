"""The search's answers, shared by every simulated bisect of one plan configuration.

`Search` is pure (search.py: no I/O, no clock, no randomness): what it proposes next, and what
it concludes, depend on its settings and on the trials recorded so far, nothing else. The plan
simulates hundreds of bisects per configuration (whole_plan.py, parallel_plan.py), and most of
them walk the same early histories (the ends, the first splits), so the search's proposals are
kept per history and a simulated bisect replays them instead of recomputing them (the design's
information sums are most of the plan's time: docs/performance.md). A history seen for the first
time gets a live `Search`, built and fed the history's records once, then kept in step. The
figures are the same as without the memo, to the bit (a test holds it).
"""

from __future__ import annotations

from collections.abc import Callable

from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.records import Record
from dsv4bisect.bisect.search.results import SearchResult
from dsv4bisect.bisect.search.search import Search

# one recorded trial: (subset, outcome, the error rates its verdict holds to or None), or ROUND:
# a round began there (`Search.begin_round`: the engines its trials meet on several nodes)
Step = tuple[frozenset[str], str, Noise | None] | str
ROUND = "round"


class SearchMemo:
    """Proposals and results by history, for searches made by `make` (one configuration)."""

    def __init__(self, make: Callable[[], Search], key: object) -> None:
        self._make = make
        self.key = key  # what the searches are (simulate.py checks it against its own)
        self._next: dict[tuple[Step, ...], tuple[frozenset[str], ...]] = {}
        self._result: dict[tuple[Step, ...], SearchResult] = {}
        self.misses = 0  # histories whose proposals were computed (the rest were replayed)

    def search(self) -> MemoSearch:
        """A fresh search (no trials recorded) that answers from the memo where it can."""
        return MemoSearch(self)


class MemoSearch:
    """The part of `Search`'s protocol the simulator uses: next, record, records, result."""

    def __init__(self, memo: SearchMemo) -> None:
        self._memo = memo
        self._history: list[Step] = []
        self._live: Search | None = None  # built on the first history the memo lacks

    def _search(self) -> Search:
        if self._live is None:
            live = self._memo._make()
            for step in self._history:
                if step == ROUND:
                    live.begin_round()
                else:
                    live.record(*step)
            self._live = live
        return self._live

    def next(self) -> list[frozenset[str]]:
        if not self._history or self._history[-1] != ROUND:
            self._history.append(ROUND)  # as `Search.next` begins a round
            if self._live is not None:
                self._live.begin_round()
        key = tuple(self._history)
        got = self._memo._next.get(key)
        if got is None:
            self._memo.misses += 1
            got = self._memo._next[key] = tuple(self._search().next())
        return list(got)

    def record(self, subset: frozenset[str] | set[str], outcome: str,
               noise: Noise | None = None) -> None:
        subset = frozenset(subset)
        self._history.append((subset, outcome, noise))
        if self._live is not None:
            self._live.record(subset, outcome, noise)

    @property
    def records(self) -> tuple[Record, ...]:
        return tuple(Record(*step) for step in self._history if step != ROUND)

    def result(self) -> SearchResult:
        key = tuple(self._history)
        got = self._memo._result.get(key)
        if got is None:
            got = self._memo._result[key] = self._search().result()
        return got
