"""The one simulated bisect behind `--plan`: K >= 1 nodes (K = 1: this machine), the ends, the
A/A, the trials, the remedy check and the fresh confirmation, priced as the driver and the
runners spend them (pricing.py), against a hidden culprit set and a noisy probe (the one oracle,
`oracle_outcome`). whole_plan.py runs it on one node with and without each lever;
parallel_plan.py on 1, 2, 4 and K nodes. Pure; deterministic given its random stream.

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
  shared (cluster/shared_ends.py): a node's trial that measures a seed block's good-end baseline
  and A/A repeat, or the bad end's block-0 run, sends them back to the driver, which sends them
  with every later trial request. So from the round after the one that measured them every
  node has them: it measures no baseline another node measured (its ∅ check of that block is
  the A/A verdict, no launch), and it probes with the sequential trial probe once any node ran
  the bad end. Within a round no node has what another measures in it (every trial of a round
  starts at once): two nodes of the first round may both measure block 0's baseline (not the
  bad end beside the good end: its probe starts ahead and is judged against the good end's
  run, `_after_good`), and until
  the bad end's round is over, trials run full size at the ends' error rates (the verdict
  states none: the search weighs it at the ends' rates), against their own block's
  baseline. Only hot runners share their ends: with fresh launches (`--fresh-launches`, the
  rows without the levers) each node measures its own baselines, as its runner does (the
  node's baseline cache).
* **The ends a failing `run` cached** (`StepCosts.ends0_cached`: the driver's cache has seed
  block 0's good end and the run's candidate, `EngineRunner.run_cache` in setup.prepare): the
  driver has them before the first round and sends them with every node's first trial
  (RayRunner seeds its ends with them: cluster/shared_ends.py `DriverEnds.keep_run`), so on
  every node block 0's ends cost nothing (their trials take no replica and start nothing ahead:
  `NodePool._cached`), no trial pays block 0's good end, and every node probes sequentially
  from the first round.
* **The ends' two looks** (bisect/end_looks.py; `StepCosts.looks`): each seed block's good end
  at look 1 (baseline and A/A repeat), then the bad end at look 1; the bad end's look-1
  evidence is drawn in the simulated world (`Setup.look1`, look_world.LookOne: the verdict
  table's smallest loss on look 1's paired answers, judged by `end_looks.settles`) on a stream
  of its own; where it does not settle, both ends on the rest of the full tier (the cases look 1
  did not keep, `look2_fraction`), charged to the bad end's trial (`CostTracker.charge`, look2).
  A bad end that look 1 settles fails: settling is the drawn loss of facts established at half
  the probe's error rate (end_looks.py), so flipping it to a PASS at the ends' rates would
  contradict the world it was drawn in. A bad end that goes on to look 2, and the good end's
  A/A verdict, keep the ends' error rates (the search weighs every end at them). The
  trials replay the cases of the look that settled block 0: priced by the trial probe simulated
  on look 1's grid (look_world.look_trial; its requests are set by its evidence, not the pool,
  so a block settled at look 2 is priced the same).
* **Seed blocks** are the driver's: the n-th trial of a subset in the bisect, whichever nodes
  ran the earlier ones.
* **No fresh confirmation**: the Ray runner cannot launch fresh (driver._confirmation: the
  report says "skipped"), so none is priced; the single-node plan (whole_plan.py) prices it.
* **Sharding** (`sharded=True`; probe/shards.py, bisect/rounds.py, docs/cluster.md "Reading
  the node plan"): the schedule the Ray runner runs (driver._search_rounds with
  RayRunner.ends_schedule, RayRunner._helpers). The ends proposed by the search run in a round
  of their own (`rounds.ends_round`; the search is asked again after them), their full-size
  probes (and, the good end's, the baseline and A/A repeat it measures) split across nodes:
  the trial's own node (`_place`), then those whose engine is up in its load-time state (a
  switch), then the rest (a launch), each paying its own launch or switch and its share of the
  probe; an end lasts as long as its slowest shard. `ends=ALONE`: the good end on every node,
  then the bad end; `ends=TOGETHER`: both at once, each on half the nodes, the bad end's
  accuracy requests sent while the good end runs and its drift scoring after
  (`NodePool._after_good`; probe/ahead.py). Every other trial runs on a node of its own,
  unsharded: a trial probe is shorter than the switch a replica would pay. A bad end beside the
  good end of its seed block is started ahead of it in unsharded rounds too (hot runners), as
  RayRunner runs it. Hot runners with the sequential trial probe only (RayRunner.shard):
  otherwise nothing is sharded and no end runs alone.

Idle slots: a round holds K node slots for as long as its slowest trial. `idle_slots` counts
node-rounds with no trial at all (a round with fewer proposals than nodes: the end checks,
the endgame's single confirmations, the remedy check); `idle_share` is the share of node time
(K × wall) spent without work, counting those empty slots and every node that waits for the
round's slowest trial after its own.

Columns share the hidden culprit sets and outcome-stream seeds of the single-node plan
(`whole_plan.common_draws`: common random numbers), so K = 1 without a confirmation is the
single-node plan's figure exactly (a test holds it).
* **The confirmation** (driver._confirmation): after a hot search that found its culprits, a
  fresh launch of them against the good end, unless a search trial already was one that failed
  (`CostTracker.launched_last`); on one node only (the Ray runner cannot launch fresh).
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dsv4bisect.bisect import remedy as rem
from dsv4bisect.bisect.end_looks import beside_trial_rates
from dsv4bisect.bisect.plan.look_world import LookOne
from dsv4bisect.bisect.plan.search_memo import MemoSearch, SearchMemo
from dsv4bisect.bisect.rounds import ALONE, BESIDE, end_nodes, ends_round, halves
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.hypotheses import HypothesisSpace, Priors
from dsv4bisect.bisect.search.pricing import CostTracker, StepCosts, is_end
from dsv4bisect.bisect.search.search import Search, Status
from dsv4bisect.probe import verdict as V

LEVERS = ("hot", "sequential", "priors", "priced")
PHASES = ("ends", "trials", "remedy", "confirmation")


@dataclass(frozen=True)
class Setup:
    """What the simulated bisect is, with every lever it has on."""

    candidates: tuple[str, ...]
    noise: Noise  # the ends' (full probe) error rates
    trial_noise: Noise  # the sequential trial probe's
    costs: StepCosts  # with the sequential fractions; `hot` as the bisect would run
    confidence: float = 0.95
    max_order: int = 2
    max_trials: int | None = None
    weights: Mapping[str, float] = field(default_factory=dict)  # with the microtest priors
    base_weights: Mapping[str, float] = field(default_factory=dict)  # without them
    confirm: bool = True  # the fresh confirmation after FOUND (hot mode only)
    # the bad end's look 1 in the simulated world, drawn per seed block where the costs price
    # the ends in two looks (`StepCosts.looks`)
    look1: LookOne | None = None

    def __post_init__(self) -> None:
        if self.costs.looks and self.look1 is None:
            raise ValueError("the ends are priced in two looks but look 1's world is not given")

    def search(self, *, priced: bool, parallel: int = 1, end_nodes: int = 1,
               beside_ends: bool = False) -> Search:
        """The search this bisect runs (`priced=False`: the unpriced design); `end_nodes`: the
        nodes an end's sharded trial takes (rounds.end_nodes); `beside_ends`: its first
        round's other proposals run beside the ends (rounds.BESIDE)."""
        return Search(self.candidates, noise=self.noise, confidence=self.confidence,
                      max_trials=self.max_trials, parallel=parallel, max_order=self.max_order,
                      priors=Priors(weights=dict(self.weights)), trial_noise=self.trial_noise,
                      costs=self.costs if priced else None, confirm=self.confirm,
                      end_nodes=end_nodes, beside_ends=beside_ends)

    def without(self, levers: Sequence[str]) -> Setup:
        """The same bisect with `levers` off."""
        out = self
        if "hot" in levers or "sequential" in levers:  # only hot sequential runners look twice
            out = replace(out, costs=out.costs.full_ends(), look1=None)
        if "hot" in levers:
            out = replace(out, costs=out.costs.fresh())
        if "sequential" in levers:
            out = replace(out, trial_noise=out.noise, costs=replace(out.costs, sequential=False))
        if "priors" in levers:
            out = replace(out, weights=out.base_weights)
        return out


def available_levers(setup: Setup) -> tuple[str, ...]:
    """The levers this bisect has (the others cannot be turned on)."""
    return tuple(lever for lever in LEVERS if _has(setup, lever))


def common_draws(setup: Setup, trials: int, seed: int) -> tuple[list[frozenset[str]], list[int]]:
    """The hidden culprit sets (flat prior) and the outcome-stream seeds of `trials` simulated
    bisects: the same for every configuration simulated with this `seed` (common random
    numbers; parallel_plan.py draws its node columns from them too)."""
    draw = random.Random(seed)
    flat = HypothesisSpace(setup.candidates, setup.max_order, Priors())
    culprits = [draw_culprits(flat, draw) for _ in range(trials)]
    return culprits, [draw.getrandbits(32) for _ in range(trials)]


def _has(setup: Setup, lever: str) -> bool:
    c = setup.costs
    if lever == "hot":
        return c.hot
    if lever == "sequential":
        return c.sequential
    if lever == "priors":
        return dict(setup.weights) != dict(setup.base_weights)
    return True  # the priced design


def oracle_outcome(subset: frozenset[str], culprits: frozenset[str], noise: Noise,
                   rng: random.Random) -> str:
    """The probe of a simulation: FAIL iff `subset` holds the culprits (the monotone model),
    flipped at the noise's rates, one draw of `rng` per trial."""
    if culprits <= subset:
        return V.PASS if rng.random() < noise.false_pass else V.FAIL
    return V.FAIL if rng.random() < noise.false_fail else V.PASS


def draw_culprits(space: HypothesisSpace, rng: random.Random) -> frozenset[str]:
    """A culprit set drawn from `space`'s prior over culprit sets (one draw of `rng`)."""
    prior = np.exp(space.log_prior[: space.n_sets])
    cumulative = np.cumsum(prior / prior.sum())
    row = int(np.searchsorted(cumulative, rng.random(), side="right"))
    return space.hypothesis(min(row, space.n_sets - 1)).members


@dataclass(frozen=True)
class NodeTrial:
    """One trial, or one shard of a trial, as its node ran it."""

    node: int  # 0..K-1
    seconds: float
    sequential: bool  # the sequential trial probe (else full size, at the ends' rates)
    trial: int = 0  # which proposal of the round (a sharded trial: one row per shard)
    start_s: float = 0.0  # after the round's start
    shards: int = 1  # nodes its probe was split across
    launched: bool = False  # its node launched the trial's own engine (hot mode)
    look: int = 0  # a bad end of two looks: the one that settled its block (1, 2); else 0
    look2_s: float = 0.0  # of `seconds`, the bad end's look 2 (after its look-1 verdict)


@dataclass(frozen=True)
class Round:
    """The trials of one round; the round lasts until its last shard is done."""

    trials: tuple[NodeTrial, ...]
    nodes: int

    @property
    def wall_s(self) -> float:
        return max((t.start_s + t.seconds for t in self.trials), default=0.0)

    @property
    def count(self) -> int:
        """Proposals run (a sharded trial is one, whatever its shards)."""
        return len({t.trial for t in self.trials})

    @property
    def idle_slots(self) -> int:
        """Nodes with no trial this round."""
        return self.nodes - len({t.node for t in self.trials})

    @property
    def idle_s(self) -> float:
        """Node-seconds without work: the empty slots, and the wait for the slowest shard."""
        return self.nodes * self.wall_s - sum(t.seconds for t in self.trials)


def pool_schedule(costs: StepCosts, sharded: bool, ends: str) -> str | None:
    """The ends schedule a pool of these costs runs (`rounds.ends_round`): `ends` where it
    shards them (the Ray runner shards only with hot runners that probe sequentially:
    RayRunner.shard), else None."""
    return ends if sharded and costs.hot and costs.sequential else None


class NodePool:
    """K nodes as the Ray executor keeps them (see the module docstring): a queue of free
    slots, and per node the engines, baselines and bad end its runner has. `sharded`: a trial
    may run as shards of its probe on several nodes (**Sharding** in the module docstring)."""

    def __init__(self, costs: StepCosts, everything: frozenset[str], nodes: int,
                 sharded: bool = False, ends: str = ALONE,
                 settles: Callable[[], bool] | None = None) -> None:
        if nodes < 1:
            raise ValueError(f"nodes is {nodes}")
        self.nodes, self.everything, self.sharded = nodes, everything, sharded
        self.ends = ends  # how a sharded round runs the ends (bisect/rounds.py)
        # whether the next bad end's look 1 settles its block (None: always, the floor's)
        self._settles = settles
        self._sequential = costs  # the costs once a node has run the bad end of block 0
        # Until then a node's non-end trials are full size against their own block's baseline.
        full = replace(costs, sequential=False)
        self.trackers = [CostTracker(full, everything) for _ in range(nodes)]
        self._free: deque[int] = deque(range(nodes))  # free longest first
        self._seen: Counter[frozenset[str]] = Counter()  # the driver's seed blocks
        self._baselines: set[int] = set()  # seed blocks whose good end the driver has
        # the driver has the bad end's block-0 run: from the start where a failing `run` cached
        # block 0's ends (`ends0_cached`: RayRunner sends them with every node's first trial)
        self._bad_end = costs.ends0_cached

    @property
    def shards(self) -> bool:
        """Whether this pool shards the ends (`pool_schedule`)."""
        return self.schedule is not None

    @property
    def schedule(self) -> str | None:
        """The ends schedule of `rounds.ends_round` (None: this pool does not shard)."""
        return pool_schedule(self._sequential, self.sharded, self.ends)

    @property
    def launches(self) -> int:
        return sum(t.launches for t in self.trackers)

    def has_bad_end(self, node: int) -> bool:
        """Whether `node` probes its trials sequentially (it has the bad end of block 0)."""
        return self.trackers[node].costs.sequential

    def run_round(self, trials: Sequence[tuple[frozenset[str], bool]]) -> Round:
        """Run one round of (subset, truly fails) trials in proposal order, one per node;
        sharded, an end alone in its round on every node (`_sharded_round`)."""
        if not 1 <= len(trials) <= self.nodes:
            raise ValueError(f"{len(trials)} trials for {self.nodes} nodes")
        for tracker in self.trackers:  # the ends the driver sends with this round's trials
            tracker.baselines |= self._baselines
            if self._bad_end:
                tracker.costs = self._sequential
        if not self.shards:
            # (the Ray runner shards only with hot runners that probe sequentially)
            ran = self._one_each(trials)
        else:
            ran = self._sharded_round(trials)
        for node in sorted({t.node for t in ran},  # back to the queue as they end
                           key=lambda n: max(t.start_s + t.seconds for t in ran if t.node == n)):
            self._free.append(node)
        if self._sequential.hot:  # what this round measured comes back to the driver
            for tracker in self.trackers:
                self._baselines |= tracker.baselines
        return Round(tuple(ran), self.nodes)

    # -- sharding ----------------------------------------------------------------------------
    def _sharded_round(self, trials: Sequence[tuple[frozenset[str], bool]]) -> list[NodeTrial]:
        """An end alone (`rounds.ends_round`) is sharded across every node; the two ends
        together each across its half (`_together`); any other trial runs on its own node,
        unsharded (RayRunner._helpers): a trial probe (a few percent of a full probe) is shorter
        than the switch a replica pays, so only the ends are worth splitting."""
        if len(trials) == 1 and is_end(trials[0][0], self.everything):
            (subset, fails), = trials
            return self._run(0, self._group(subset, self.nodes), subset, fails)
        if self.schedule == BESIDE:
            return self._one_each(trials)  # the ends unsharded, what is beside them too
        if len(trials) == 2 and all(is_end(s, self.everything) for s, _ in trials):
            return self._together(trials)
        return self._one_each(trials)

    def _together(self, trials: Sequence[tuple[frozenset[str], bool]]) -> list[NodeTrial]:
        """The good end on its half of the nodes, the bad end on the other (RayRunner with
        `TOGETHER`), the bad end started ahead of the good end's run (`_after_good`)."""
        (good, good_fails), (bad, bad_fails) = sorted(trials, key=lambda t: len(t[0]))
        size = halves(self.nodes)
        cached = self._cached(bad)
        first = self._run(0, self._group(good, size), good, good_fails)
        bad_end = self._run(1, self._group(bad, size), bad, bad_fails, lent=not cached)
        return first + (bad_end if cached else
                        self._after_good(bad_end, max(t.seconds for t in first)))

    def _one_each(self, trials: Sequence[tuple[frozenset[str], bool]]) -> list[NodeTrial]:
        """Each trial on a node of its own. A bad end beside the good end of its seed block
        (hot runners, which share their ends) is started ahead of the good end's run and
        judged against it (`_after_good`), as RayRunner runs it; no node of it measures a
        baseline of its own. With the trials beside the ends (`BESIDE`), every other trial of
        the good end's round is started ahead the same way (ProbingPolicy.starts_ahead)."""
        blocks = [self._seen[s] for s, _ in trials]  # the driver's seed block of each
        good = next((b for (s, _), b in zip(trials, blocks) if not s), None)
        also = self.schedule == BESIDE  # the trials beside the ends
        beside = [self._sequential.hot and b == good and not self._cached(s) and (
            s == self.everything or (also and bool(s))) for (s, _), b in zip(trials, blocks)]
        ran = [self._run(i, [self._place(subset)], subset, fails, lent=lent)[0]
               for i, ((subset, fails), lent) in enumerate(zip(trials, beside))]
        good_done = next((t.seconds for t, (s, _) in zip(ran, trials) if not s), 0.0)
        return [part for t, lent in zip(ran, beside)
                for part in (self._after_good([t], good_done) if lent else [t])]

    def _after_good(self, bad_end: list[NodeTrial], good_done: float) -> list[NodeTrial]:
        """The bad end's shards as run beside the good end (probe/ahead.py): each node
        launches (or switches) and sends its share of the accuracy requests at once, waits for
        the good end's run (the driver sends it when the good end's trial is done, after
        `good_done` seconds), then scores its share of the drift transcripts
        (`drift_fraction` of the probe; look 1 keeps every drift transcript), and where its
        look 1 does not settle the block, probes look 2 after that verdict (`look2_s`)."""
        out = []
        for t in bad_end:
            drift = self.trackers[t.node].costs.probe_s * self._sequential.drift_fraction \
                / t.shards
            ahead = t.seconds - drift - t.look2_s
            out += [replace(t, seconds=ahead, look2_s=0.0),
                    replace(t, seconds=drift + t.look2_s, start_s=max(ahead, good_done))]
        return out

    def _group(self, subset: frozenset[str], size: int) -> list[int]:
        """`size` free nodes, in the order the Ray runner takes them: the trial's own node
        first (`_place`), then those whose engine is up in its load-time state, then the rest,
        free longest first. An end whose ends a `run` cached (`_cached`) takes its own only."""
        first = self._place(subset)
        if self._cached(subset):
            size = 1
        rest = sorted(self._free, key=lambda n: not self.trackers[n].engine_up(subset))
        rest = rest[:size - 1]
        for node in rest:
            self._free.remove(node)
        return [first, *rest]

    def _cached(self, subset: frozenset[str]) -> bool:
        """Whether `subset` is an end of seed block 0 whose ends a failing `run` cached
        (`StepCosts.ends0_cached`): the driver has them before the first round and sends them
        with every node's first trial (RayRunner: `DriverEnds.keep_run`), so its trial probes
        nothing, on no replica, and starts nothing ahead of the good end."""
        return (self._sequential.ends0_cached and is_end(subset, self.everything)
                and self._seen[subset] == 0)

    # -- one trial ---------------------------------------------------------------------------
    def _place(self, subset: frozenset[str]) -> int:
        """The free node whose engine is up in the trial's load-time state, else the node
        free longest (RayRunner._acquire)."""
        node = next((n for n in self._free if self.trackers[n].engine_up(subset)),
                    self._free[0])
        self._free.remove(node)
        return node

    def _run(self, index: int, group: Sequence[int], subset: frozenset[str],
             fails: float | bool, lent: bool = False) -> list[NodeTrial]:
        """The trial on `group`'s nodes, each running 1/len(group) of its probe (and of the
        baseline and A/A repeat it measures), paying its own launch or switch. `lent`: the
        good end's baseline it is judged against is sent to every node of it (measured by the
        good end's trial of the same round: `_together`)."""
        end = is_end(subset, self.everything)
        block = self._seen[subset]
        self._seen[subset] += 1
        look = 0  # the bad end's look 1 settles its block or not, one draw for every shard
        if subset == self.everything and self._sequential.looks:
            look = 1 if self._settles is None or self._settles() else 2
        out = []
        for node in group:
            tracker = self.trackers[node]
            sequential = tracker.costs.sequential and not end
            first, second = _shard(tracker, subset, fails, block, len(group),
                                   node == group[0] and not lent, look == 2, node == group[0])
            out.append(NodeTrial(node, first + second, sequential, index, 0.0, len(group),
                                 tracker.launched_last, look, second))
        if subset == self.everything and block == 0 and self._sequential.sequential:
            for node in group:  # their later trials: the sequential trial probe
                self.trackers[node].costs = self._sequential
            self._bad_end = True  # and every node's from the next round
        return out


def _shard(tracker: CostTracker, subset: frozenset[str], like_bad: float | bool, block: int,
           shards: int, primary: bool, look2: bool = False, own: bool = True
           ) -> tuple[float, float]:
    """Charge one node's shard: its own engine (launch or switch) and 1/`shards` of the probe,
    at the driver's seed block `block` (the node's own count of this subset's trials would miss
    those run on other nodes). A baseline the trial measures on the way: the good end's trial
    shards it (it is its probe); any other trial's node (`primary`) measures it whole on its own
    engine while the replicas wait (HotEngineRunner: replicas serve the trial's configuration
    only), so a replica's shard does not charge it. `look2`: the bad end's look 1 did not
    settle its block: the trial's own node (`own`) probes the good end again whole, then every
    shard its share of the bad end at the full tier (`CostTracker.charge_parts`: the seconds
    to the look-1 verdict and those of look 2)."""
    tracker.seen[subset] = block
    judged_in = 0 if tracker.costs.sequential and subset != tracker.everything else block
    lent = set() if primary or not subset else {judged_in} - tracker.baselines
    tracker.baselines |= lent
    try:
        return tracker.charge_parts(subset, like_bad, shards, look2, own)
    finally:
        tracker.baselines -= lent


@dataclass(frozen=True)
class NodeRun:
    """One simulated bisect: its rounds, and the seconds of each phase (PHASES)."""

    rounds: tuple[Round, ...]
    trials: int  # probe runs, remedy and confirmation included
    launches: int  # on all nodes together
    correct: bool
    phase_s: Mapping[str, float]

    @property
    def wall_s(self) -> float:
        """The rounds' wall time, then the confirmation (the per-phase figures add up the same
        seconds in another order: whole_plan.py sums them by phase)."""
        return sum(r.wall_s for r in self.rounds) + self.phase_s["confirmation"]


def search_memo(cfg: Setup, nodes: int, priced: bool, schedule: str | None = None
                ) -> SearchMemo:
    """The memo that every simulated bisect of this configuration shares (search_memo.py), its
    search told how the executor runs the ends (`schedule`, bisect/rounds.py; None: unsharded)."""
    spread, beside = end_nodes(schedule, nodes), schedule == BESIDE
    return SearchMemo(lambda: cfg.search(priced=priced, parallel=nodes, end_nodes=spread,
                                         beside_ends=beside),
                      (cfg, nodes, priced, spread, beside))


def simulate(cfg: Setup, nodes: int, culprits: frozenset[str], rng: random.Random,
             priced: bool, memo: SearchMemo | None = None, sharded: bool = False,
             round_size: int | None = None, ends: str = ALONE) -> NodeRun:
    """One whole bisect on `nodes` nodes against `culprits`, outcomes drawn from `rng` in
    trial order. A round's wall time counts to the phase of its trials (ends, trials, remedy);
    the confirmation is priced where `cfg` asks for it (one node, hot). `memo`: the search's
    answers shared with the configuration's other simulated bisects (`search_memo`; the same
    figures, faster). `sharded`: a trial's probe may be split across nodes (NodePool), `ends`:
    how the ends run then (bisect/rounds.py); `round_size`: the search's proposals per round
    (default: one per node)."""
    everything = frozenset(cfg.candidates)
    size = nodes if round_size is None else round_size
    if not 1 <= size <= nodes:
        raise ValueError(f"{size} proposals a round on {nodes} nodes")
    # the looks' draws have a stream of their own: the outcome stream stays the one of the
    # same bisect with full-tier ends (common random numbers)
    looks = random.Random(repr(rng.getstate()))
    pool = NodePool(cfg.costs, everything, nodes, sharded, ends,
                    (lambda: cfg.look1.settles(looks)) if cfg.look1 is not None else None)
    spread = end_nodes(pool.schedule, size)  # the nodes the search prices an end's trial on
    beside = pool.schedule == BESIDE
    if memo is None:
        search: Search | MemoSearch = cfg.search(priced=priced, parallel=size, end_nodes=spread,
                                                 beside_ends=beside)
    elif memo.key != (cfg, size, priced, spread, beside):
        raise ValueError("the search memo was made for another configuration")
    else:
        search = memo.search()
    rounds: list[Round] = []
    phase = dict.fromkeys(PHASES, 0.0)
    fresh_fails: set[frozenset[str]] = set()  # failed in an engine launched for them (hot)

    def run(subsets: list[frozenset[str]], name: str | None = None
            ) -> list[tuple[frozenset[str], str, Noise | None]]:
        """The round's (subset, outcome, the rates the driver records it at: None for the
        search's own full-probe rates)."""
        subsets = ends_round(subsets, everything, pool.schedule)
        done = pool.run_round([(s, culprits <= s) for s in subsets])
        rounds.append(done)
        ends = any(is_end(s, everything) for s in subsets)
        phase[name or ("ends" if ends else "trials")] += done.wall_s
        # trials beside the ends, where the bad end's look 1 beside them settled its block,
        # hold to that look's rates (driver.beside_rates)
        settled = pool.schedule == BESIDE and frozenset() in subsets and any(
            t.look == 1 for t in done.trials if subsets[t.trial] == everything)
        look1_rates = beside_trial_rates(cfg.noise) if settled else None
        out = []
        for i, subset in enumerate(subsets):
            shards = [t for t in done.trials if t.trial == i]
            sequential = shards[0].sequential
            if sequential:
                rates: Noise | None = cfg.trial_noise
            else:  # a full probe: the search's own rates, or look 1's beside a settled bad end
                rates = None if is_end(subset, everything) else look1_rates
            outcome = oracle_outcome(subset, culprits, rates or cfg.noise, rng)
            if shards[0].look == 1:  # look 1 settled it: the world's loss of facts, established
                outcome = V.FAIL
            if all(t.launched for t in shards) and outcome == V.FAIL:
                fresh_fails.add(subset)
            out.append((subset, outcome, rates))
        return out

    while proposals := search.next():
        for subset, outcome, rates in run(proposals):
            search.record(subset, outcome, rates)
    result = search.result()
    trials = 0
    if result.status is Status.FOUND and result.culprits:
        rem.simulate(cfg.candidates, result.culprits, search.records,
                     lambda subset: run([subset], "remedy")[0][1])
        confirmed = frozenset(result.culprits) in fresh_fails  # a search trial was it
        if cfg.costs.hot and cfg.confirm and not confirmed:
            phase["confirmation"] += pool.trackers[0].confirmation(culprits <= result.culprits)
            trials += 1
    correct = result.status is Status.FOUND and result.culprits == culprits
    trials += sum(r.count for r in rounds)
    return NodeRun(tuple(rounds), trials, pool.launches, correct, phase)
