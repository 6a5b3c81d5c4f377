"""Which of a round's proposals run, where the executor shards the ends (pure).

A sharding executor (the Ray runner with hot runners that probe sequentially: `RayRunner.ends`)
runs the ends (∅ and the full set) proposed by the search in a round of their own, their
full-size probes split across the nodes (or, `BESIDE`, unsharded with the search's first trials
beside them), and every other trial on a node of its own, unsharded
(a trial probe, a few percent of a full probe, is shorter than the switch a second node would
pay to serve part of it). The ends are most of a bisect, and there are three ways to run them:

* `ALONE`: the first end proposed alone in its round, across every node, the search asked again
  after it; so the good end on all K nodes, then the bad end on all K;
* `TOGETHER`: both ends in one round, each on its own half of the nodes (K // 2 each), sharded
  within its half; the bad end's half launches and sends its accuracy requests while the good
  end runs (they do not depend on it: probe/ahead.py) and scores its drift transcripts against
  the good end's run once it exists. An end proposed without the other runs alone;
* `BESIDE`: both ends in one round, each on one node, unsharded, and the round's other
  proposals beside them, each on a node of its own (K >= 3): they launch and send their
  requests while the good end runs, as the bad end does, and are judged against the good end's
  run. Their probe is the ends' look (a trial before the bad end is known is probed at its
  block's look: trials/end_probes.py `ends_for`), so they end with the ends, and the search
  starts with every engine they launched up and their verdicts in hand (docs/cluster.md,
  "Trials beside the ends"). The ends take longer than `TOGETHER`'s.

Which one is cheaper depends on K and the costs (a launch against a share of the probe), so the
plan simulates the whole bisect with each and the executor runs the one it chose
(plan/parallel_plan.py `choose_ends`). The driver (driver._search_rounds) and the plan
(plan/simulate.py) both call `ends_round`, so the plan prices the rounds the executor runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from dsv4bisect.bisect.search.pricing import is_end

ALONE = "alone"
TOGETHER = "together"
BESIDE = "beside"
SCHEDULES = (ALONE, TOGETHER, BESIDE)


def ends_round(proposals: Sequence[frozenset[str]], everything: frozenset[str],
               schedule: str | None) -> list[frozenset[str]]:
    """The round a sharding executor runs of `proposals` under `schedule` (None: not sharding,
    all of them). With an end among them, the ends only (the search is asked again after them:
    its proposals depend on its records only): `ALONE` the first end proposed, `TOGETHER` each
    end proposed once, the good end first; `BESIDE` those, then the other proposals, each
    once."""
    if schedule is None:
        return list(proposals)
    if schedule not in SCHEDULES:
        raise ValueError(f"ends schedule `{schedule}`")
    ends = list(dict.fromkeys(s for s in proposals if is_end(s, everything)))
    if not ends:
        return list(proposals)
    if schedule == ALONE:
        return ends[:1]
    ends = sorted(ends, key=len)
    if schedule == BESIDE:
        return ends + [s for s in dict.fromkeys(proposals) if not is_end(s, everything)]
    return ends


def halves(nodes: int) -> int:
    """Nodes each end takes in a `TOGETHER` round: its own and an equal share of the other
    idle ones (RayRunner.begin_round: K // 2; with K odd one node waits)."""
    return max(1, nodes // 2)


def end_nodes(schedule: str | None, parallel: int) -> int:
    """Of the search's `parallel` nodes (one trial each), those an end's trial takes as the
    search prices it (search/pricing.py `NodeSlots.spread`): every one with the ends `ALONE`,
    half of them `TOGETHER`, one `BESIDE` or where the executor does not shard (None)."""
    if schedule is None:
        return 1
    if schedule not in SCHEDULES:
        raise ValueError(f"ends schedule `{schedule}`")
    if schedule == BESIDE:
        return 1
    return parallel if schedule == ALONE else halves(parallel)


def schedules(nodes: int) -> tuple[str, ...]:
    """The schedules worth pricing on `nodes` nodes: `BESIDE` needs a node beside the ends."""
    return SCHEDULES if nodes >= 3 else (ALONE, TOGETHER)
