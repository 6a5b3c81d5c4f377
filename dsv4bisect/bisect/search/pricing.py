"""What a bisect step costs, in seconds, given what ran before it (pure; docs/bisect.md,
"The priced design").

The policy priced here is the one the driver follows:

* **Engines.** In hot mode a trial of configuration C runs in the engine of its load-time state
  λ(C) = C ∩ load-time candidates: switched (drain, switch at a barrier, CUDA-graph re-capture,
  prefix-cache flush: `switch_s`) when that engine is up, else launched in C itself
  (`launch_s`) after stopping the least recently used engine; `pool` engines are kept up at
  once (`EngineSlots`: the hot runner's own pool, trials/engine_pool.py, keeps them by it). A trial
  that launched its engine is a fresh launch's (`launched_last`): when it is the culprits'
  configuration and fails, it is the fresh confirmation, which then costs nothing more. With
  hot mode off every trial is a fresh launch.
* **Nodes.** A search that proposes K trials a round (the Ray executor, one trial a node) prices
  them on K nodes' engines (`NodeSlots`): each trial of the round takes a node of its own, one
  whose engine holds its load-time state where one is free (a switch), else the free node used
  longest ago (a launch there), as RayRunner places them; the next round frees every node
  again (`new_round`, called as the search begins a round: `Search.begin_round`), so a round's
  recorded trials leave the engines the executor left, each launch on a node of its own.
  Priced on one node's engines instead, a round's second trial in ∅ after one in the bad end's
  state looked like a launch though another node held ∅. Where the executor shards the ends
  (bisect/rounds.py), an end's trial takes `end_nodes` of them (`NodeSlots.spread`: half the
  nodes each with the ends together, every node with the ends alone), so after the ends the
  search knows which nodes hold ∅ and which the bad end's state.
* **Probes.** The good end is probed at full size plus its A/A repeat (`aa_fraction` of the full
  probe), and that trial's verdict is the A/A verdict; the bad end at full size; every other
  configuration with the sequential trial probe, whose expected length is `like_good_fraction`
  or `like_bad_fraction` of the full probe for a trial that behaves like the good or the bad end.
  With the ends' two looks (`looks`, bisect/end_looks.py) a block's ends are first probed at
  `look1_fraction` (the A/A repeat `look1_aa_fraction`), and both again at full size in their
  engines where the bad end's look 1 does not settle (`charge(..., look2=True)`; a quote takes
  `look2_chance` of it). A sharded bad end's look 2 shards the bad end's probe only: the good
  end's is measured whole on the trial's own node (`_look2`).
* **Seed blocks.** The n-th trial of a configuration uses seed block n. A full-size paired
  probe judges it against the good end's baseline *of that block*: the first trial in a new
  block measures that baseline first (the good end's engine, full probe + A/A), so a re-test is
  dearer than a new configuration, and the priced design knows it. The sequential trial probe
  draws a re-test's requests from the first baseline's pool instead (other requests, in another
  order: the pool holds 1/fraction trials' worth), so its re-tests need no new baseline.

Everything is derived from the sequence of subsets tested, so the search that uses it stays
deterministic given its records (a resume replays them). The engines a resumed driver really
finds up may differ (it starts with none); the prices are then off by one launch, the proposals
are not.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)


def is_end(subset: frozenset[str], everything: frozenset[str]) -> bool:
    """Whether `subset` is one of the bisect's ends: the good end (nothing on) or the bad end
    (every candidate on), each measured by a full-size probe."""
    return not subset or subset == everything


@dataclass(frozen=True)
class StepCosts:
    """The seconds one step costs and the policy that decides which step pays what."""

    launch_s: float = 0.0  # start an engine (weights, JIT, CUDA-graph capture, health)
    switch_s: float = 0.0  # hot switch inside a running engine
    probe_s: float = 60.0  # the full probe of the tier (or one --test-cmd call)
    aa_fraction: float = 0.0  # the A/A repeat, as a share of the full probe
    sequential: bool = False  # non-end trials use the sequential trial probe
    like_good_fraction: float = 1.0  # its expected share of the full probe, trial like good
    like_bad_fraction: float = 1.0  # ... like the bad end
    hot: bool = False  # switch call-time patches inside a running engine
    pool: int = 1  # engines kept up at once
    load_time: frozenset[str] = field(default_factory=frozenset)  # need a fresh launch
    paired: bool = False  # trials are judged against the good end's baseline of their block
    # the drift scoring's share of a candidate's full probe: the part that needs the good end's
    # run (probe/ahead.py); the rest can run before it exists (bisect/rounds.py, TOGETHER)
    drift_fraction: float = 0.0
    # The ends' two looks (bisect/end_looks.py): each seed block's ends are probed first at
    # look 1, `look1_fraction` of the full probe (the good end's A/A repeat there
    # `look1_aa_fraction` of it); where the bad end's look 1 does not settle them, both ends
    # again at the full tier. 1: look 1 keeps every case (or the ends are full): one look.
    look1_fraction: float = 1.0
    look1_aa_fraction: float = 0.0
    look2_chance: float = 0.0  # P(look 1 does not settle), the quotes' expectation
    # look 2's own share of the full probe: the cases look 1 did not keep (and the polluting
    # phase again); look 1's requests are not sent again (probe/looks.py)
    look2_fraction: float = 1.0
    # seed block 0's ends are in the cache a failing `run` left (the good end's pair and the
    # run's candidate, judged against it: bisect/trials/end_probes.py `run_ends`): their
    # trials send no request and launch nothing, and no trial pays block 0's good end
    ends0_cached: bool = False
    # seed block 0's good end alone is in the baseline cache (a `run` of another candidate, an
    # earlier bisect against the same good end): no trial measures its baseline and A/A repeat,
    # and its end check is a re-test against them (its engine and one probe, no A/A repeat)
    good0_cached: bool = False

    def __post_init__(self) -> None:
        for name in ("launch_s", "switch_s", "probe_s", "aa_fraction", "like_good_fraction",
                     "like_bad_fraction", "drift_fraction", "look1_fraction",
                     "look1_aa_fraction", "look2_chance", "look2_fraction"):
            value = getattr(self, name)
            if not value >= 0 or value == float("inf"):
                raise ValueError(f"{name} is {value}")
        if self.pool < 1:
            raise ValueError(f"pool is {self.pool}")
        if self.look2_chance > 1.0:
            raise ValueError(f"look2_chance is {self.look2_chance}")

    def fresh(self) -> StepCosts:
        """The same costs with hot switching off (every trial a fresh launch)."""
        return replace(self, hot=False)

    def full_ends(self) -> StepCosts:
        """The same costs with the ends probed at the full tier, one look."""
        return replace(self, look1_fraction=1.0, look1_aa_fraction=0.0, look2_chance=0.0,
                       look2_fraction=1.0)

    def to_json(self) -> dict[str, Any]:
        return {"launch_s": self.launch_s, "switch_s": self.switch_s, "probe_s": self.probe_s,
                "aa_fraction": self.aa_fraction, "sequential": self.sequential,
                "like_good_fraction": self.like_good_fraction,
                "like_bad_fraction": self.like_bad_fraction, "hot": self.hot, "pool": self.pool,
                "load_time": sorted(self.load_time), "paired": self.paired,
                "drift_fraction": self.drift_fraction,
                **({"look1_fraction": self.look1_fraction,
                    "look1_aa_fraction": self.look1_aa_fraction,
                    "look2_chance": self.look2_chance,
                    "look2_fraction": self.look2_fraction} if self.looks else {}),
                **({"ends0_cached": True} if self.ends0_cached else {}),
                **({"good0_cached": True} if self.good0_cached else {})}

    @property
    def looks(self) -> bool:
        """Whether the ends are probed in two looks (look 1 keeps less than the full tier)."""
        return self.look1_fraction < 1.0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepCosts:
        return cls(**{**data, "load_time": frozenset(data.get("load_time", ()))})


UNIFORM = StepCosts()  # every trial the same price: the unpriced design


class EngineSlots(Generic[K]):
    """Which load-time states have an engine up and which to stop for the next launch: at most
    `size`, the least recently used stopped first (a switch into an engine refreshes it). The
    hot runner's pool (trials/engine_pool.py) and the plan's price of it (`CostTracker`) are
    this one policy; the runner stops the engines it is told to."""

    def __init__(self, size: int, up: Iterable[K] = ()) -> None:
        self.size = size
        self.up: list[K] = list(up)  # least recently used first

    def use(self, key: K) -> bool:
        """A trial in the engine of `key`: whether it is up (it is then the most recent)."""
        if key not in self.up:
            return False
        self.remove(key)
        self.up.append(key)
        return True

    def make_room(self) -> list[K]:
        """The engines to stop so that one more fits, least recently used first (gone now)."""
        out = self.up[:max(0, len(self.up) - self.size + 1)]
        del self.up[:len(out)]
        return out

    def add(self, key: K) -> None:
        self.up.append(key)

    def copy(self) -> EngineSlots[K]:
        return EngineSlots(self.size, self.up)

    def remove(self, key: K) -> None:
        if key in self.up:
            self.up.remove(key)


class NodeSlots:
    """The engines of K nodes as one round of trials meets them: per node an `EngineSlots`
    pool, and the nodes a trial of the round in flight already took (`busy`). `up` holds the
    states a trial could switch into now (an engine on a free node)."""

    def __init__(self, nodes: int, size: int) -> None:
        self.nodes = [EngineSlots[frozenset[str]](size) for _ in range(nodes)]
        self.last_used = [0] * nodes  # the tick of each node's last trial
        self.tick = 0
        self.busy: set[int] = set()
        self._room: int | None = None  # the node `make_room` cleared for the next `add`

    def copy(self) -> NodeSlots:
        other = copy.copy(self)
        other.nodes = [n.copy() for n in self.nodes]
        other.last_used, other.busy = list(self.last_used), set(self.busy)
        return other

    def new_round(self) -> None:
        self.busy.clear()

    @property
    def up(self) -> list[frozenset[str]]:
        out: list[frozenset[str]] = []
        for node in sorted(self._free(), key=self.last_used.__getitem__):
            out += [s for s in self.nodes[node].up if s not in out]
        return out

    def use(self, state: frozenset[str]) -> bool:
        node = next((n for n in self._free() if state in self.nodes[n].up), None)
        if node is None:
            return False
        self.nodes[node].use(state)
        self._take(node)
        return True

    def spread(self, state: frozenset[str], count: int) -> bool:
        """An end's trial sharded across `count` nodes (bisect/rounds.py): its engine on the
        `count` free nodes used longest ago, as the executor lays the ends out (`TOGETHER`: the
        good end on one half, the bad end on the other; `ALONE`: each on every node). Whether
        the first of them, the trial's own, had it up."""
        chosen = sorted(self._free(), key=self.last_used.__getitem__)[:count]
        ups = []
        for node in chosen:
            ups.append(self.nodes[node].use(state))
            if not ups[-1]:
                self.nodes[node].make_room()
                self.nodes[node].add(state)
            self._take(node)
        return ups[0]

    def make_room(self) -> list[frozenset[str]]:
        self._room = min(self._free(), key=self.last_used.__getitem__)
        return self.nodes[self._room].make_room()

    def add(self, state: frozenset[str]) -> None:
        if self._room is None:
            self.make_room()
        node, self._room = self._room, None
        assert node is not None
        self.nodes[node].add(state)
        self._take(node)

    def _free(self) -> list[int]:
        if len(self.busy) == len(self.nodes):  # more trials than nodes: the next round
            self.busy.clear()
        return [n for n in range(len(self.nodes)) if n not in self.busy]

    def _take(self, node: int) -> None:
        self.tick += 1
        self.last_used[node] = self.tick
        self.busy.add(node)


def ends_seconds(costs: StepCosts, everything: frozenset[str]) -> float:
    """Expected seconds of seed block 0's two ends, the good end then the bad end, from no
    engine up: with two looks, look 1 and, at `look2_chance`, look 2 as the runner pays it
    (both ends' engines again: a launch each where the pool holds one engine)."""
    def ends(look2: bool) -> float:
        tracker = CostTracker(costs, everything)
        return tracker.charge(frozenset(), 0.0) + tracker.charge(everything, 1.0, look2=look2)

    if not costs.looks:
        return ends(False)
    return (1 - costs.look2_chance) * ends(False) + costs.look2_chance * ends(True)


class CostTracker:
    """The state that prices the next step: engines up (`EngineSlots`), the seed blocks whose
    baseline was measured, and how often each configuration ran. `nodes`: the trials of a
    round run one a node on that many nodes (`NodeSlots`); `end_nodes` of them run an end's
    trial, its probe sharded (`NodeSlots.spread`)."""

    def __init__(self, costs: StepCosts, everything: frozenset[str], nodes: int = 1,
                 end_nodes: int = 1) -> None:
        self.costs, self.everything = costs, everything
        self.end_nodes = end_nodes  # of the K nodes, those an end's sharded trial takes
        self.slots: EngineSlots[frozenset[str]] | NodeSlots = (
            EngineSlots(costs.pool) if nodes == 1 else NodeSlots(nodes, costs.pool))
        # seed blocks whose good-end baseline is measured (block 0's where cached)
        self.baselines: set[int] = {0} if costs.ends0_cached or costs.good0_cached else set()
        self.seen: Counter[frozenset[str]] = Counter()
        self.spent_s = 0.0
        self.launches = 0
        self.launched_last = False  # the last trial charged launched its own engine (hot mode)

    def copy(self) -> CostTracker:
        other = copy.copy(self)
        other.slots = self.slots.copy()
        other.baselines, other.seen = set(self.baselines), Counter(self.seen)
        return other

    @property
    def engines(self) -> list[frozenset[str]]:
        """The load-time states whose engine is up (on a free node), least recently used
        first."""
        return list(self.slots.up)

    def new_round(self) -> None:
        """The next round's trials: every node free again (one node: nothing changes)."""
        if isinstance(self.slots, NodeSlots):
            self.slots.new_round()

    # -- prices ------------------------------------------------------------------------------
    def quote(self, subset: frozenset[str], p_fail: float) -> float:
        """Expected seconds of the next trial of `subset`, which truly fails with `p_fail`."""
        return self.copy().charge(subset, p_fail)

    def charge(self, subset: frozenset[str], like_bad: float | bool, shards: int = 1,
               look2: bool | None = None, own: bool = True) -> float:
        """Run the next trial of `subset` (like the bad end with probability / truth
        `like_bad`): advance the state, return its seconds (expected where a probability).
        `shards`: this node runs 1/shards of the trial's probe (a sharded probe on several
        nodes: the Ray executor); a baseline another trial measures on the way is its own
        node's, whole (only the good end's trial shards its baseline: it is its probe).
        `look2`: the bad end's look 1 did not settle its block, so both ends are probed again
        at the full tier (None: at `look2_chance`, the quotes' expectation; ignored where
        `looks` is off or `subset` is not the bad end). `own`: this node is the trial's own,
        not a replica serving a share of its probe (`_look2`)."""
        return sum(self.charge_parts(subset, like_bad, shards, look2, own))

    def charge_parts(self, subset: frozenset[str], like_bad: float | bool, shards: int = 1,
                     look2: bool | None = None, own: bool = True) -> tuple[float, float]:
        """`charge`, in its two parts: the seconds up to the trial's first verdict, and those
        of the bad end's look 2 after it (0 but for a bad end whose look 1 did not settle)."""
        c = self.costs
        end = is_end(subset, self.everything)
        self.launched_last = False  # until this trial's own engine launches (`_engine`)
        # a re-test draws the next seed block; a sequential trial's re-test draws other
        # requests against the first block's ends (HotEngineRunner), an end's needs its own
        block = 0 if c.sequential and not end else self.seen[subset]
        self.seen[subset] += 1
        if c.ends0_cached and end and block == 0:  # the ends a failing `run` measured
            return 0.0, 0.0
        seconds = 0.0
        if c.paired and block not in self.baselines:
            good = c.probe_s * ((c.look1_fraction + c.look1_aa_fraction) if c.looks
                                else 1 + c.aa_fraction)
            # the good end's trial is its baseline: sharded like an end's
            seconds += (self._engine(frozenset(), 0 if subset else self.end_nodes)
                        + good / (1 if subset else shards))
            self.baselines.add(block)
        # a paired good end's trial is its block's baseline (measured now or before); its
        # verdict is the A/A's. One read from the baseline cache (`good0_cached`) is not a
        # fresh measurement of this bisect: its end check probes the good end again against
        # it (HotEngineRunner `_probe`: "good end (re-test)"), in its own engine
        if subset or not c.paired or (c.good0_cached and block == 0):
            seconds += self._engine(self._state(subset), self.end_nodes if end else 0
                                    ) + self._probe(subset, float(like_bad)) / shards
        second = (self._look2(look2, shards, own) if c.looks and subset == self.everything
                  else 0.0)
        self.spent_s += seconds + second
        return seconds, second

    def _look2(self, drawn: bool | None, shards: int, own: bool) -> float:
        """Both ends on the rest of the full tier after a look 1 that did not settle (the
        cases look 1 did not keep, `look2_fraction`, and the A/A repeat's rest): on the trial's
        own node the good end's baseline and A/A repeat whole in its engine (the trial's
        replicas serve the bad end's configuration only: HotEngineRunner), then its share of
        the bad end back in its own; a replica (`own` False) serves its share of the bad end
        in the engine it was switched to for the trial."""
        c = self.costs
        bad = c.probe_s * c.look2_fraction / shards
        aa_rest = max(0.0, c.aa_fraction - c.look1_aa_fraction)
        good = c.probe_s * (c.look2_fraction + aa_rest) if own else 0.0
        if drawn is None:  # a quote: the engines as they are, at the chance
            return c.look2_chance * (good + bad + 2 * c.switch_s * own)
        if not drawn:
            return 0.0
        if not own:
            return bad
        return self._engine(frozenset()) + self._engine(self._state(self.everything)) + good + bad

    def confirmation(self, like_bad: float | bool) -> float:
        """The fresh confirmation after FOUND (hot mode): one fresh launch of the good end plus
        the culprits, judged with the sequential probe."""
        seconds = self.costs.launch_s + self.costs.probe_s * self._fraction(float(like_bad))
        self.spent_s += seconds
        self.launches += 1
        return seconds

    # -- parts -------------------------------------------------------------------------------
    def _state(self, subset: frozenset[str]) -> frozenset[str]:
        return subset & self.costs.load_time

    def _engine(self, state: frozenset[str], spread: int = 0) -> float:
        """Seconds to have the engine of `state` ready (and the pool after it). `spread`: an
        end's trial, on that many nodes of several (`NodeSlots.spread`: the nodes used longest
        ago, as the executor lays the ends out, not the free one that holds the state)."""
        slots = self.slots
        if spread and self.costs.hot and isinstance(slots, NodeSlots):
            # the engine is up on each node the end takes now, launched where it was not
            up, placed = slots.spread(state, spread), True
        else:
            up, placed = self.costs.hot and slots.use(state), False
        self.launched_last = self.costs.hot and not up
        if up:
            return self.costs.switch_s
        self.launches += 1
        if self.costs.hot and not placed:
            self.slots.make_room()
            self.slots.add(state)
        return self.costs.launch_s

    def _probe(self, subset: frozenset[str], like_bad: float) -> float:
        c = self.costs
        # an end: full size, or look 1's share; so is any trial probed before its block's bad
        # end is known where the ends look twice (the block's look: end_probes.ends_for), as
        # the trials beside the ends are (bisect/rounds.py BESIDE)
        if is_end(subset, self.everything) or (c.looks and not c.sequential):
            return c.probe_s * c.look1_fraction
        return c.probe_s * self._fraction(like_bad)

    def _fraction(self, like_bad: float) -> float:
        c = self.costs
        if not c.sequential:
            return 1.0
        return like_bad * c.like_bad_fraction + (1 - like_bad) * c.like_good_fraction

    def engine_up(self, subset: frozenset[str]) -> bool:
        """Whether the next trial of `subset` would be a hot switch (no launch)."""
        return self.costs.hot and self._state(subset) in self.slots.up
