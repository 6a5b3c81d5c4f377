"""Which of a round's proposals run, where the executor shards the ends (pure).

A sharding executor (the Ray runner with hot runners that probe sequentially:
`RayRunner.ends_alone`) runs an end proposed by the search alone in its round, its full-size
probe split across every node, and every other trial on a node of its own, unsharded. The two
ends are most of a bisect (each a launch and a full-size probe), and the bad end replays the
good end's run, so it cannot start before it: one end after the other, each on every node, is
the shortest way to measure them. A trial probe (a few percent of a full probe) is shorter than
the switch a second node would pay to serve part of it, so later rounds give each trial its own
node instead. The driver (driver._search_rounds) and the plan (plan/simulate.py) both call
`ends_alone`, so the plan prices the rounds the executor runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from dsv4bisect.bisect.search.pricing import is_end


def ends_alone(proposals: Sequence[frozenset[str]],
               everything: frozenset[str]) -> list[frozenset[str]]:
    """The round a sharding executor runs of `proposals`: the first end proposed, alone (the
    search is asked again after it: its proposals depend on its records only), else all of
    them."""
    end = next((s for s in proposals if is_end(s, everything)), None)
    return [end] if end is not None else list(proposals)
