"""`--plan --executor ray --parallel K`: the whole bisect on K nodes, as the Ray executor runs it
(pure; docs/cluster.md, "Reading the node plan").

What is modelled, and where the code does it:

* **Rounds** (driver.py): the search proposes up to K subsets per round (`Search(parallel=K)`);
  each trial of a round runs on its own node; the next round starts when the round's slowest
  trial is done. The remedy check runs its trials one per round.
* **Which node** (ray_executor.py, `RayRunner._acquire`): the proposals of a round in order,
  each takes the free slot whose engine is up in its load-time state (`CostTracker.engine_up`:
  a hot switch, not a launch), else the slot free longest; a slot goes back to the queue
  when its trial ends.
* **Each node its own runner** (node_runner.py, hot_runner.py on the node): its own engines
  (one `CostTracker` per node, `pool` engines up at once: 1 per SGLang node). The ends are
  shared (trials/shared_ends.py): a node's trial that measures a seed block's good-end baseline
  and A/A repeat, or the bad end's block-0 run, sends them back to the driver, which sends them
  with every later trial request. So from the round after the one that measured them every
  node has them: it measures no baseline another node measured (its ∅ check of that block is
  the A/A verdict, no launch), and it probes with the sequential trial probe once any node ran
  the bad end. Within a round no node has what another measures in it (every trial of a round
  starts at once): two nodes of the first round may both measure block 0's baseline, and until
  the bad end's round is over, trials run full size at the ends' error rates (the verdict
  states none: the search weighs it at the ends' rates), against their own block's
  baseline. Only hot runners share their ends: with fresh launches (`--fresh-launches`, the
  rows without the levers) each node measures its own baselines, as its runner does (the
  node's baseline cache).
* **Seed blocks** are the driver's: the n-th trial of a subset in the bisect, whichever nodes
  ran the earlier ones.
* **No fresh confirmation**: the Ray runner cannot launch fresh (driver._confirmation: the
  report says "skipped"), so none is priced; the single-node plan (whole_plan.py) prices it.

Idle slots: a round holds K node slots for as long as its slowest trial. `idle_slots` counts
node-rounds with no trial at all (a round with fewer proposals than nodes: the end checks,
the endgame's single confirmations, the remedy check); `idle_share` is the share of node time
(K × wall) spent without work, counting those empty slots and every node that waits for the
round's slowest trial after its own.

Columns share the hidden culprit sets and outcome-stream seeds of the single-node plan
(`whole_plan.common_draws`: common random numbers), so K = 1 without a confirmation is the
single-node plan's figure exactly (a test holds it).
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dsv4bisect.bisect import remedy as rem
from dsv4bisect.bisect.plan.whole_plan import Setup, available_levers, common_draws
from dsv4bisect.bisect.search.pricing import CostTracker, StepCosts
from dsv4bisect.bisect.search.search import Status
from dsv4bisect.errors import BisectError
from dsv4bisect.probe import verdict as V

NODE_COUNTS = (1, 2, 4)  # the columns `--plan --executor ray` always shows


@dataclass(frozen=True)
class NodeTrial:
    """One trial as its node ran it."""

    node: int  # 0..K-1
    seconds: float
    sequential: bool  # the sequential trial probe (else full size, at the ends' rates)


@dataclass(frozen=True)
class Round:
    """The trials of one round, one per node used; the round lasts as long as the slowest."""

    trials: tuple[NodeTrial, ...]
    nodes: int

    @property
    def wall_s(self) -> float:
        return max((t.seconds for t in self.trials), default=0.0)

    @property
    def idle_slots(self) -> int:
        """Nodes with no trial this round."""
        return self.nodes - len(self.trials)

    @property
    def idle_s(self) -> float:
        """Node-seconds without work: the empty slots, and the wait for the slowest trial."""
        return self.nodes * self.wall_s - sum(t.seconds for t in self.trials)


class NodePool:
    """K nodes as the Ray executor keeps them (see the module docstring): a queue of free
    slots, and per node the engines, baselines and bad end its runner has."""

    def __init__(self, costs: StepCosts, everything: frozenset[str], nodes: int) -> None:
        if nodes < 1:
            raise ValueError(f"nodes is {nodes}")
        self.nodes, self.everything = nodes, everything
        self._sequential = costs  # the costs once a node has run the bad end of block 0
        # Until then a node's non-end trials are full size against their own block's baseline.
        full = replace(costs, sequential=False)
        self.trackers = [CostTracker(full, everything) for _ in range(nodes)]
        self._free: deque[int] = deque(range(nodes))  # free longest first
        self._seen: Counter[frozenset[str]] = Counter()  # the driver's seed blocks
        self._baselines: set[int] = set()  # seed blocks whose good end the driver has
        self._bad_end = False  # the driver has the bad end's block-0 run

    @property
    def launches(self) -> int:
        return sum(t.launches for t in self.trackers)

    def has_bad_end(self, node: int) -> bool:
        """Whether `node` probes its trials sequentially (it has the bad end of block 0)."""
        return self.trackers[node].costs.sequential

    def run_round(self, trials: Sequence[tuple[frozenset[str], bool]]) -> Round:
        """Run one round of (subset, truly fails) trials, one per node, in proposal order."""
        if not 1 <= len(trials) <= self.nodes:
            raise ValueError(f"{len(trials)} trials for {self.nodes} nodes")
        for tracker in self.trackers:  # the ends the driver sends with this round's trials
            tracker.baselines |= self._baselines
            if self._bad_end:
                tracker.costs = self._sequential
        ran = [self._run(self._place(subset), subset, fails) for subset, fails in trials]
        for trial in sorted(ran, key=lambda t: t.seconds):  # back to the queue as they end
            self._free.append(trial.node)
        if self._sequential.hot:  # what this round measured comes back to the driver
            for tracker in self.trackers:
                self._baselines |= tracker.baselines
        return Round(tuple(ran), self.nodes)

    def _place(self, subset: frozenset[str]) -> int:
        """The free node whose engine is up in the trial's load-time state, else the node
        free longest (RayRunner._acquire)."""
        node = next((n for n in self._free if self.trackers[n].engine_up(subset)),
                    self._free[0])
        self._free.remove(node)
        return node

    def _run(self, node: int, subset: frozenset[str], fails: bool) -> NodeTrial:
        tracker = self.trackers[node]
        end = not subset or subset == self.everything
        block = self._seen[subset]
        self._seen[subset] += 1
        sequential = tracker.costs.sequential and not end
        # The node's tracker prices its own engines and baselines, at the driver's seed block
        # (its own count of this subset's trials would miss those run on other nodes).
        tracker.seen[subset] = block
        seconds = tracker.charge(subset, fails)
        if subset == self.everything and block == 0 and self._sequential.sequential:
            tracker.costs = self._sequential  # its later trials: the sequential trial probe
            self._bad_end = True  # and every node's from the next round
        return NodeTrial(node, seconds, sequential)


@dataclass(frozen=True)
class NodeFigures:
    """One node count and lever setting over every simulated bisect."""

    nodes: int
    levers: bool  # every lever the bisect has on, or none
    mean_wall_s: float
    p90_wall_s: float
    mean_rounds: float
    mean_trials: float  # remedy included
    mean_launches: float  # on all nodes together
    mean_idle_slots: float  # node-rounds with no trial
    idle_share: float  # node time without work / node time (K × wall), over every run
    p_correct: float

    def to_json(self) -> dict[str, float | int | bool]:
        return {"nodes": self.nodes, "levers": self.levers, "mean_wall_s": self.mean_wall_s,
                "p90_wall_s": self.p90_wall_s, "mean_rounds": self.mean_rounds,
                "mean_trials": self.mean_trials, "mean_launches": self.mean_launches,
                "mean_idle_slots": self.mean_idle_slots, "idle_share": self.idle_share,
                "p_correct": self.p_correct}


@dataclass(frozen=True)
class NodePlan:
    runs: int
    levers: tuple[str, ...]  # the levers this bisect has ("without" turns them all off)
    rows: tuple[NodeFigures, ...]  # per node count: with the levers, then without

    def row(self, nodes: int, levers: bool) -> NodeFigures:
        return next(r for r in self.rows if r.nodes == nodes and r.levers == levers)


def node_counts(asked: int) -> tuple[int, ...]:
    """1, 2 and 4 nodes, and the K asked for where it is another."""
    return tuple(sorted({*NODE_COUNTS, asked}))


def plan_nodes(setup: Setup, nodes: Sequence[int] = NODE_COUNTS, *, trials: int = 100,
               seed: int = 0, of: int | None = None) -> NodePlan:
    """Simulate `trials` whole bisects per node count, with every lever and without any, on the
    culprit sets and outcome streams of `whole_plan.plan_bisect(setup, trials=of, seed=seed)`
    (its first `trials`; `of` defaults to `trials`)."""
    if trials < 1:
        raise BisectError("the plan needs at least one simulated run", "use trials >= 1")
    if not nodes or min(nodes) < 1:
        raise BisectError(f"node counts {list(nodes)}", "use at least one node")
    setup = replace(setup, confirm=False)  # the Ray executor cannot launch fresh
    levers = available_levers(setup)
    culprits, seeds = common_draws(setup, max(of or trials, trials), seed)
    culprits, seeds = culprits[:trials], seeds[:trials]
    bare = setup.without(levers)
    rows = []
    for k in nodes:
        for on, cfg in ((True, setup), (False, bare)):
            priced = on or "priced" not in levers
            runs = [simulate_nodes(cfg, k, c, random.Random(s), priced)
                    for c, s in zip(culprits, seeds)]
            rows.append(_figures(k, on, runs))
    return NodePlan(trials, levers, tuple(rows))


@dataclass(frozen=True)
class NodeRun:
    rounds: tuple[Round, ...]
    trials: int
    launches: int
    correct: bool

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.rounds)


def simulate_nodes(cfg: Setup, nodes: int, culprits: frozenset[str], rng: random.Random,
                   priced: bool) -> NodeRun:
    """One whole bisect on `nodes` nodes against `culprits`, outcomes drawn from `rng` in
    trial order (as `whole_plan._simulate` draws them)."""
    everything = frozenset(cfg.candidates)
    search = cfg.search(priced=priced, parallel=nodes)
    pool = NodePool(cfg.costs, everything, nodes)
    rounds: list[Round] = []

    def run(subsets: list[frozenset[str]]) -> list[tuple[str, bool]]:
        done = pool.run_round([(s, culprits <= s) for s in subsets])
        rounds.append(done)
        out = []
        for subset, trial in zip(subsets, done.trials):
            fails = culprits <= subset
            noise = cfg.trial_noise if trial.sequential else cfg.noise
            flip = rng.random() < (noise.false_pass if fails else noise.false_fail)
            out.append((V.FAIL if fails != flip else V.PASS, trial.sequential))
        return out

    while proposals := search.next():
        for subset, (outcome, sequential) in zip(proposals, run(proposals)):
            search.record(subset, outcome, cfg.trial_noise if sequential else None)
    result = search.result()
    if result.status is Status.FOUND and result.culprits:
        rem.simulate(cfg.candidates, result.culprits, search.records,
                     lambda subset: run([subset])[0][0])
    correct = result.status is Status.FOUND and result.culprits == culprits
    trials = sum(len(r.trials) for r in rounds)
    return NodeRun(tuple(rounds), trials, pool.launches, correct)


def _figures(nodes: int, levers: bool, runs: list[NodeRun]) -> NodeFigures:
    wall = np.array([r.wall_s for r in runs])
    node_time = float(wall.sum()) * nodes
    idle = sum(rd.idle_s for r in runs for rd in r.rounds)
    return NodeFigures(
        nodes=nodes, levers=levers,
        mean_wall_s=float(wall.mean()), p90_wall_s=float(np.quantile(wall, 0.9)),
        mean_rounds=float(np.mean([len(r.rounds) for r in runs])),
        mean_trials=float(np.mean([r.trials for r in runs])),
        mean_launches=float(np.mean([r.launches for r in runs])),
        mean_idle_slots=float(np.mean([sum(rd.idle_slots for rd in r.rounds) for r in runs])),
        idle_share=idle / node_time if node_time > 0 else 0.0,
        p_correct=sum(r.correct for r in runs) / len(runs),
    )
