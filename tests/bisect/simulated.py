"""A search run to the end against the simulated probe (plan/simulate.py's oracle): the loop the
search tests and tests/benchmarks/bench_search.py measure a bare search with (no costs, no
engines; the whole bisect's simulation is plan/simulate.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from dsv4bisect.bisect.plan.simulate import oracle_outcome
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.search import Search, SearchResult, Status


@dataclass(frozen=True)
class SimulatedRun:
    culprits: frozenset[str]
    result: SearchResult
    trials: int  # every probe run, the two first end checks included
    rounds: int  # rounds of up to `parallel` launches
    ends_separated: bool

    @property
    def correct(self) -> bool:
        return self.result.status is Status.FOUND and self.result.culprits == self.culprits


def simulate(search: Search, culprits: frozenset[str], noise: Noise,
             rng: random.Random) -> SimulatedRun:
    """Run `search` to the end against a probe with `noise`'s error rates."""
    rounds = 0
    while proposals := search.next():
        rounds += 1
        for subset in proposals:
            search.record(subset, oracle_outcome(subset, culprits, noise, rng))
    return SimulatedRun(culprits, search.result(), search.trials_used, rounds, search.ends_known)
