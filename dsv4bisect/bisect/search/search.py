"""The noise-aware culprit search: a pure object (no I/O, no clock, no randomness).

`Search` keeps a posterior over culprit sets (singles, interacting pairs, optionally triples)
and three catch-alls (hypotheses.py), proposes subsets by expected information per launch
(design.py), and is deterministic given its records: replaying the same records into a fresh
`Search` gives the same proposals, which is how the driver resumes (with several trials a
round, asking for each round as it replays them: `begin_round`).

Phases: `ends` (∅ and the full set, repeated under noise until they are known to differ;
only ∅ when no trial is judged against a measurement of the bad end: see `_bad_end_first`),
`search` (until one hypothesis holds `confidence` of the posterior), `confirm` (confirm.py:
each member removed must pass), `done`. Every trial of every phase counts.

A record may carry the error rates its own verdict holds to (the sequential trial probe states
them); its likelihood uses those. BETWEEN (a sequential probe at its cap) is evidence for
neither end. With `costs` (pricing.py) the design picks subsets by expected information per
second instead of per trial; `trial_noise` tells it the rates the next non-end trials will hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dsv4bisect.bisect.search import confirm
from dsv4bisect.bisect.search.confirm import Check, loglik
from dsv4bisect.bisect.search.design import (
    CREDIT_INFO_SHARE,
    Noise,
    RoundDesign,
    capacity,
    entropy,
    flips,
)
from dsv4bisect.bisect.search.hypotheses import (
    BAD_END_PASSES,
    GOOD_END_FAILS,
    UNEXPLAINED,
    Hypothesis,
    HypothesisSpace,
    Priors,
)
from dsv4bisect.bisect.search.pricing import CostTracker, StepCosts, is_end
from dsv4bisect.bisect.search.records import Record
from dsv4bisect.bisect.search.results import SearchResult, Status, describe
from dsv4bisect.bisect.search.settings import validate_settings
from dsv4bisect.errors import BisectError
from dsv4bisect.probe import verdict as V

NOISELESS = Noise()
DEFAULT_PRIORS = Priors()

# Under `unexplained` a configuration between the ends is a coin, so it lands between the ends
# more often than a configuration that truly behaves like one of them: a BETWEEN is this many
# times as likely there as under any culprit set or end catch-all.
_BETWEEN_RATIO = 2.0
# The remedy check runs the bad end without the culprits after a `found`, and a hot bisect's
# fresh confirmation launches the culprits; a search trial of that configuration (in a launch of
# its own, for the confirmation) counts for it. The priced design credits at most this share of
# a trial's price.
_MAX_CREDIT = 0.9
# a round of switches only replaces the greedy round when its bits per second are this much higher
_RATE_TIE = 1e-9


class Search:
    """Posterior search over culprit sets; see the module docstring and docs/bisect.md."""

    def __init__(
        self,
        candidates: Sequence[str],
        *,
        noise: Noise = NOISELESS,
        confidence: float = 0.95,
        max_trials: int | None = None,
        parallel: int = 1,
        max_order: int = 2,
        priors: Priors = DEFAULT_PRIORS,
        design_discount: float = 0.03,
        trial_noise: Noise | None = None,
        costs: StepCosts | None = None,
        bad_end_first: bool | None = None,
        confirm: bool = True,
        end_nodes: int = 1,
        beside_ends: bool = False,
    ) -> None:
        validate_settings(
            candidates, noise, confidence, max_trials, parallel, max_order, design_discount,
            end_nodes,
        )
        self.noise, self.confidence = noise, confidence
        self.max_trials, self.parallel = max_trials, parallel
        self.design_discount = design_discount
        self.trial_noise = trial_noise or noise  # what the design expects of non-end trials
        self.costs = costs  # None: the unpriced design (information per trial)
        self.confirm = confirm  # a fresh confirmation follows a FOUND in hot mode (driver.py)
        self._load = (costs.load_time & frozenset(candidates)) if costs else frozenset()
        self.space = HypothesisSpace(candidates, max_order, priors)
        self._log_post = self.space.log_prior.copy()
        self._records: list[Record] = []
        self._skipped: set[frozenset[str]] = set()
        self._ends_known = False
        self._confident_since: dict[int, int] = {}  # hypothesis -> first record after it led
        self._cache: tuple[int, list[frozenset[str]]] | None = None
        self._round_at = 0  # records before the round in flight began (`begin_round`)
        self._post: np.ndarray | None = None  # posterior of the current records
        self._checks_cache: dict[int, tuple[Check, ...]] = {}  # likewise, per hypothesis
        self._loglik = loglik(noise)  # [observed, true]
        # a round's trials priced on the nodes that run them (pricing.py, "Nodes"); an end's
        # sharded trial on `end_nodes` of them (bisect/rounds.py `end_nodes`)
        self._tracker = CostTracker(costs or StepCosts(), frozenset(self.space.candidates),
                                    nodes=parallel, end_nodes=end_nodes)
        self._set_row = {m.tobytes(): i for i, m in enumerate(self.space.members)}
        # every set's sufficiency asks a fresh look where one flipped trial could settle a
        # single early: several trials a round, or the sequential trial probe (confirm.py)
        self._fresh_sufficiency = parallel > 1 or bool(costs and costs.sequential)
        # None: from the costs (see `_bad_end_first`)
        self._bad_end_first = _bad_end_first(costs) if bad_end_first is None else bad_end_first
        # the executor runs a round's other proposals beside the ends (bisect/rounds.py BESIDE):
        # the first round's free nodes get trials, not more copies of the ends
        self._beside_ends = beside_ends

    # -- state ---------------------------------------------------------------------------------
    @property
    def candidates(self) -> tuple[str, ...]:
        return self.space.candidates

    @property
    def records(self) -> tuple[Record, ...]:
        return tuple(self._records)

    @property
    def trials_used(self) -> int:
        return len(self._records)

    def posterior(self) -> np.ndarray:
        """[H + 3] probabilities: culprit sets, then good-end-fails, bad-end-passes, unexplained."""
        if self._post is None:
            p = np.exp(self._log_post - self._log_post.max())
            self._post = p / p.sum()
        return self._post.copy()

    def top(self, k: int = 5) -> list[tuple[Hypothesis, float]]:
        post = self.posterior()
        order = np.argsort(-post, kind="stable")[:k]
        return [(self.space.hypothesis(int(i)), float(post[i])) for i in order]

    def marginals(self) -> dict[str, float]:
        """P(candidate belongs to the culprit set)."""
        probs = self.posterior()[: self.space.n_sets] @ self.space.members_f
        return {c: float(p) for c, p in zip(self.candidates, probs)}

    @property
    def ends_known(self) -> bool:
        """Whether the good and bad ends are known to differ (at the requested confidence)."""
        return self._ends_known

    @property
    def phase(self) -> str:
        if self._stop_reason() is not None:
            return "done"
        if self._confirming() is not None:
            return "confirm"
        return "search" if self._ends_known else "ends"

    # -- the protocol --------------------------------------------------------------------------
    def record(self, subset: frozenset[str] | set[str], outcome: str,
               noise: Noise | None = None) -> None:
        """Add one observation: PASS, FAIL, BETWEEN (a sequential probe at its cap: evidence
        for neither end; may be re-tested), or CANNOT_TEST (routed around: git bisect's skip).
        `noise`: the error rates this verdict holds to, where its probe states them."""
        if outcome not in V.SEARCH_WORDS:
            raise BisectError(f"`{outcome}` is not an outcome the search records",
                              "PASS, FAIL, BETWEEN or CANNOT_TEST")
        subset = frozenset(subset)
        mask = self.space.mask(subset)
        if noise is not None:
            noise.validate()
        self._records.append(Record(subset, outcome, noise))
        self._cache, self._post = None, None
        self._checks_cache.clear()
        # the engines and baselines after it (prices only); on several nodes it took a node of
        # its own in the round in flight (`begin_round`), as the executor placed it
        self._tracker.charge(subset, 0.5)
        if outcome == V.CANNOT_TEST:
            self._skipped.add(subset)
            return
        table = self._loglik if noise is None else loglik(noise)
        self._log_post += self._likelihood(mask, outcome, table)
        self._log_post -= self._log_post.max()
        if not self._ends_known and self._ends_differ():
            self._ends_known = True
        lead = self._confident()
        if lead is not None:
            self._confident_since.setdefault(lead, len(self._records))

    def next(self) -> list[frozenset[str]]:
        """Up to `parallel` subsets to test next, one round; empty when the search is over.
        The trials recorded after it are that round's (`begin_round`)."""
        if self._cache is None or self._cache[0] != len(self._records):
            self.begin_round()
            proposals = self._propose() if self._stop_reason() is None else []
            self._cache = (len(self._records), proposals)
        return list(self._cache[1])

    def begin_round(self) -> None:
        """The trials recorded from now on ran in one round, each on a node of its own (the
        executor's placement, `NodeSlots`): every node is free again. `next` and
        `singles_to_test` call it, so a resume that asks for each round as the driver does
        (driver._search_rounds) prices the engines as the live search did; a replay of the
        records alone calls it where the rounds began. One node: nothing changes."""
        if self._round_at != len(self._records):
            self._round_at = len(self._records)
            self._tracker.new_round()

    def result(self) -> SearchResult:
        post = self.posterior()
        best = int(np.argmax(post))
        hyp = self.space.hypothesis(best)
        status = self._stop_reason() or (Status.RUNNING if self.next() else Status.UNTESTABLE)
        several = self._failing_alone() if status is Status.SEVERAL else frozenset()
        return SearchResult(
            status=status,
            culprits=several or (hyp.members if hyp.is_set else None),
            posterior=float(post[best]),
            top=tuple(self.top(5)),
            checks=self._checks(best),
            trials_used=self.trials_used,
            message=describe(status, hyp, float(post[best]), several),
        )

    def remaining(self) -> int:
        """A rough estimate of the trials still needed (plan.py simulates it properly)."""
        if self._stop_reason() is not None:
            return 0
        lead = self._confirming()
        if lead is not None:
            return max(1, len(self._pending(lead)))
        stop = entropy(np.array([self.confidence, 1 - self.confidence]))
        bits = max(float(entropy(self.posterior()) - stop), 0.0)
        return max(1, math.ceil(bits / max(capacity(self.noise), 1e-3)) + (not self._ends_known))

    # -- conclusions ---------------------------------------------------------------------------
    def _confident(self) -> int | None:
        post = self.posterior()
        best = int(np.argmax(post))
        return best if post[best] >= self.confidence else None

    def _confirming(self) -> int | None:
        """The confident hypothesis whose checks still need trials, if any."""
        lead = self._confident()
        if lead is None or not (self._ends_known or self._is_end_catch_all(lead)):
            return None
        return lead if self._pending(lead) else None

    def _is_end_catch_all(self, index: int) -> bool:
        return self.space.hypothesis(index).kind in (GOOD_END_FAILS, BAD_END_PASSES)

    def _checks(self, index: int) -> tuple[Check, ...]:
        if index not in self._checks_cache:
            self._checks_cache[index] = self._compute_checks(index)
        return self._checks_cache[index]

    def _compute_checks(self, index: int) -> tuple[Check, ...]:
        noiseless = all(r == 0 for n in (self.noise, self.trial_noise)
                        for r in (n.false_fail, n.false_pass))
        evidence = confirm.Evidence(
            records=self._records,
            loglik=self._loglik,
            confidence=self.confidence,
            fresh_from=0 if noiseless else self._confident_since.get(index, len(self._records)),
            good_end_established=bool(self.posterior()[-3] <= 1 - self.confidence),
            candidates=self.candidates,
            max_order=self.space.max_order,
            fresh_sufficiency=self._fresh_sufficiency,
        )
        return confirm.checks_for(self.space.hypothesis(index), evidence)

    def _pending(self, index: int) -> list[frozenset[str]]:
        return confirm.pending(self._checks(index), self._skipped, self.candidates)

    def _stop_reason(self) -> Status | None:
        if self._several_seen() and not self._singles_pending():
            return Status.SEVERAL
        lead = self._confident()
        singles = lead is not None and self._singles_phase(lead)
        if singles and not self._singles_pending():
            if len(self._failing_alone()) >= 2:
                return Status.SEVERAL
            if self.space.hypothesis(lead).kind == GOOD_END_FAILS:
                return Status.UNEXPLAINED  # never "the good end fails" while it passed
        if (
            lead is not None
            and not (singles and self._singles_pending())
            and (self._ends_known or self._is_end_catch_all(lead))
            and not self._pending(lead)
        ):  # confirmed, or nothing could confirm it
            kind = self.space.hypothesis(lead).kind
            return Status.FOUND if kind == "set" else Status(kind)
        if self.max_trials is not None and self.trials_used >= self.max_trials:
            return Status.BUDGET
        return None

    # -- several culprits -----------------------------------------------------------------------
    # The hypotheses say "fails iff it holds all of a set"; patches that each fail on their own
    # break that model, and its nearest catch-alls are "the good end fails" or "unexplained".
    # When one of those leads while every measurement of the good end passed, each candidate is
    # run alone: two or more that fail are reported by name as several culprits (docs/bisect.md).
    def _good_end_passed(self) -> bool:
        good = [r.outcome for r in self._records if r.evidence and not r.subset]
        return bool(good) and all(o == V.PASS for o in good)

    def _singles_phase(self, lead: int) -> bool:
        kind = self.space.hypothesis(lead).kind
        return ((kind in (GOOD_END_FAILS, UNEXPLAINED) and self._good_end_passed())
                or self._several_seen())

    def _several_seen(self) -> bool:
        """Two candidates failed alone while the good end passed: no culprit set explains that
        (it would lie inside both), so every candidate is run alone."""
        return len(self._failing_alone()) >= 2 and self._good_end_passed()

    def singles_to_test(self) -> list[frozenset[str]]:
        """After the remedy check failed twice (another culprit remains, driver.py): the
        candidates not yet run alone. Recorded, they let the result name several culprits."""
        self.begin_round()
        return self._singles_pending()

    def _singles_pending(self) -> list[frozenset[str]]:
        done = {r.subset for r in self._records if r.evidence} | self._skipped
        return [frozenset({c}) for c in self.candidates if frozenset({c}) not in done]

    def _failing_alone(self) -> frozenset[str]:
        """Candidates whose runs alone failed more often than they passed."""
        votes: dict[str, int] = {}
        for r in self._records:
            if r.evidence and len(r.subset) == 1 and r.outcome in (V.PASS, V.FAIL):
                (name,) = r.subset
                votes[name] = votes.get(name, 0) + (1 if r.outcome == V.FAIL else -1)
        return frozenset(n for n, v in votes.items() if v > 0)

    # -- proposals -----------------------------------------------------------------------------
    def _propose(self) -> list[frozenset[str]]:
        k = self.parallel
        if self.max_trials is not None:
            k = min(k, self.max_trials - self.trials_used)
        lead = self._confident()
        singles = self._several_seen() or (lead is not None and self._singles_phase(lead))
        if singles and self._singles_pending():
            return self._singles_pending()[:k]
        lead = self._confirming()
        if lead is not None:
            return self._propose_checks(lead, k)
        if not self._ends_known:
            tracker = self._tracker.copy()  # the prices after the round's earlier subsets
            design = RoundDesign(self.space, self.posterior(), self.noise)
            return self._propose_ends(design, k, tracker)
        free = self._round(k, switches_only=False)
        if k == 1 or self.costs is None or not self.costs.hot or not free.launches:
            return free.subsets  # (a round that launches nothing is its own switch round)
        # several trials a round in hot engines: a round lasts as long as its longest trial,
        # so one launch holds every node up by the launch. Built again of switches only, it
        # runs instead where its information per second of the round is higher and it asks
        # nearly as much (a weak round of switches only puts off a launch the answer needs)
        switches = self._round(k, switches_only=True)
        if (switches.subsets and switches.rate > free.rate * (1 + _RATE_TIE)
                and switches.bits >= CREDIT_INFO_SHARE * free.bits):
            return switches.subsets
        return free.subsets

    def _round(self, k: int, switches_only: bool) -> _Round:
        """The greedy round of up to `k` trials (`switches_only`: each in an engine up on a
        free node), with its joint information and expected wall seconds. A launch in a round
        that already waits for one is priced as a switch: the round lasts the launch anyway."""
        tracker = self._tracker.copy()  # the prices after the round's earlier subsets
        design = RoundDesign(self.space, self._design_posterior(), self.trial_noise)
        out: list[frozenset[str]] = []
        bits = wall = 0.0
        launches = False
        avoid = self._skipped_masks()

        def fits(mask: np.ndarray) -> bool:
            return not switches_only or tracker.engine_up(self.space.subset(mask))

        for _ in range(k):
            options = [o for o in self._options(design, tracker) if fits(o)]
            price = self._pricer(design, tracker, wall)
            choice = design.choose(options, avoid, price)
            if choice is None and avoid:  # route around skipped subsets: one-element changes
                choice = design.choose([f for o in options for f in flips(o) if fits(f)],
                                       avoid, price)
            if choice is None:
                break
            subset = self.space.subset(choice)
            bits = design.info_of(choice)
            wall = max(wall, tracker.quote(subset, design.p_fail(choice)))
            launches = launches or not tracker.engine_up(subset)
            self._commit(design, tracker, choice)
            out.append(subset)
        return _Round(out, bits, wall, launches)

    def _propose_checks(self, lead: int, k: int) -> list[frozenset[str]]:
        """The next trials of the confirm phase. A check "C minus x passes" is spoken for by any
        configuration that holds C minus x and not x, so where one of them runs in an engine
        that is up (or in the load-time state the remedy check will need) it is preferred to C
        minus x itself: the phase then launches as few engines as its checks need.

        Order: a check that is a hot switch now; else the bad end without the lead while its
        engine is up (the remedy check, driver.py, then reuses that outcome instead of
        launching it again after the checks); else the culprit set itself (a launch for it is
        the fresh confirmation, driver.py); else a launch, in the remedy's load-time state
        where one of the check's configurations is in it."""
        hyp = self.space.hypothesis(lead)
        tracker = self._tracker
        rest = frozenset(self.candidates) - hyp.members  # the bad end without the lead
        remedy_state = self._remedy_state(hyp)
        # one configuration per check: in an engine up now (`hot`), else in the remedy's
        # load-time state or the check's own (`cold`, a launch). On several nodes each hot pick
        # takes a node of the round, the checks with the fewest configurations first, so a
        # check whose engine's nodes the earlier ones took switches into another engine that
        # is up where it can, and waits for the next round where it cannot
        hot: list[frozenset[str]] = []
        cold: list[frozenset[str]] = []
        options = self._check_options(lead)
        several = self.parallel > 1
        placed = tracker.copy() if several else tracker  # the round's nodes as picks take them
        if several:
            options.sort(key=lambda opts: (len(opts), opts[0] != hyp.members))
        for opts in options:
            pick = next((o for o in opts if placed.engine_up(o)), None)
            if pick is not None:
                if pick not in hot:
                    hot.append(pick)
                    if several:
                        placed.charge(pick, 0.5)
                continue
            if several and any(tracker.engine_up(o) for o in opts):
                continue  # its engine's nodes are this round's: a switch in the next one
            if remedy_state is not None:
                pick = next((o for o in opts if o & self._load == remedy_state), None)
            pick = opts[0] if pick is None else pick
            if pick not in cold and pick not in hot:
                cold.append(pick)
        if (cold and not hot and hyp.is_set and rest and not tracker.seen[rest]
                and tracker.engine_up(rest)):
            return [rest]
        picks = [p for group in (hot, cold)
                 for p in sorted(group, key=lambda p: p != hyp.members)]  # stable
        out = picks[:k]
        if (0 < len(out) < k and hyp.is_set and rest and not tracker.seen[rest]
                and rest not in out and rest not in self._skipped):
            # a slot the checks leave idle runs the remedy check now (driver._remedy counts
            # the search's own trials of it first), not in a round of its own after them
            if not self._beside_ends:
                out.append(rest)
            else:
                out = self._with_remedy(out, rest, options, k)
        return out

    def _with_remedy(self, picks: list[frozenset[str]], rest: frozenset[str],
                     options: list[list[frozenset[str]]], k: int) -> list[frozenset[str]]:
        """A round of checks `picks` with the remedy check `rest` in an idle slot, where the
        ends ran one node each with trials beside them (`BESIDE`): every load-time state the
        bisect met is then up on some node, so a remedy check that would launch into a round
        of switches (holding every node up by the launch) waits for a round where it
        switches. It joins where it switches on a node the checks leave free, or the round
        launches anyway; else the round is placed with the remedy first where every check
        still switches; else it waits (measured: docs/performance.md, issue 42 Part 12)."""
        placed = self._tracker.copy()
        launches = False
        for pick in picks:
            launches = launches or not placed.engine_up(pick)
            placed.charge(pick, 0.5)
        if launches or placed.engine_up(rest):
            return [*picks, rest]
        placed = self._tracker.copy()
        if not placed.engine_up(rest):
            return picks
        placed.charge(rest, 0.5)
        out = [rest]
        for opts in options:
            if any(o in out for o in opts):
                continue
            pick = next((o for o in opts if placed.engine_up(o)), None)
            if pick is None:
                return picks
            placed.charge(pick, 0.5)
            out.append(pick)
        return out if len(out) <= k else picks

    def _remedy_state(self, hyp: Hypothesis) -> frozenset[str] | None:
        """The load-time state of the remedy check's configuration (the bad end without `hyp`)
        while that configuration is untested; None without load-time candidates."""
        rest = frozenset(self.candidates) - hyp.members
        if not (self._load and hyp.is_set and rest) or self._tracker.seen[rest]:
            return None
        return rest & self._load

    def _check_options(self, lead: int) -> list[list[frozenset[str]]]:
        """Per unconfirmed check of `lead`: the configurations that speak for it, its own first
        (confirm.pending), then, for "C minus x passes", C minus x in each load-time state where
        it can run (the engines up and the remedy's): C minus x plus that state's load-time
        candidates other than x."""
        remedy_state = self._remedy_state(self.space.hypothesis(lead))
        states = [*self._tracker.engines, *([remedy_state] if remedy_state is not None else [])]
        out = []
        for check in self._checks(lead):
            own = confirm.pending([check], self._skipped, self.candidates)
            if not own:
                continue
            opts = list(own)
            if check.member is not None and check.config:
                for state in states:
                    alt = check.config | (state - {check.member})
                    if alt & self._load == state and alt not in opts and alt not in self._skipped:
                        opts.append(alt)
            out.append(opts)
        return out

    def _propose_ends(self, design: RoundDesign, k: int,
                      tracker: CostTracker) -> list[frozenset[str]]:
        seen = {r.subset for r in self._records if r.evidence}
        ends = (frozenset(), frozenset(self.candidates))
        first = ends if self._bad_end_first else ends[:1]
        tried = {r.subset for r in self._records if r.outcome != V.CANNOT_TEST}
        if any(end in self._skipped and end not in tried for end in first):
            return []  # an end that cannot be tested: the search cannot start
        out = [end for end in first if end not in seen][:k]
        for end in out:
            self._commit(design, tracker, self.space.mask(end))
        while len(out) < k:
            # beside the ends (BESIDE), once both are proposed: the round design's best trials
            # at the prior, the ends' outcomes among what it expects; else more of the ends (a
            # sharding executor splits their probes across the nodes: rounds.ends_round)
            if self._beside_ends and not self._records and set(ends) <= set(out):
                options = [o for o in self._options(design, tracker)
                           if not is_end(self.space.subset(o), ends[1])]
            else:
                options = [self.space.mask(e) for e in ends]
            choice = design.choose(options, self._skipped_masks(), self._pricer(design, tracker))
            if choice is None:
                break
            self._commit(design, tracker, choice)
            out.append(self.space.subset(choice))
        return out

    def _commit(self, design: RoundDesign, tracker: CostTracker, mask: np.ndarray) -> None:
        design.commit(mask)
        tracker.charge(self.space.subset(mask), 0.5)

    def _pricer(self, design: RoundDesign, tracker: CostTracker, waits: float = 0.0
                ) -> Callable[[np.ndarray], tuple[float, float]] | None:
        """Expected seconds of a trial of a subset, and its credit (None: the unpriced design).
        Two trials the bisect runs anyway are credited with the chance that this is that trial:
        the bad end without the likely culprit set (the remedy check), and, in hot mode, a
        first trial of a culprit set that launches its own engine (a FAIL there is the fresh
        confirmation, driver.py). `waits`: how long the round's earlier trials already last;
        where that is a launch, another launch costs the round what a switch would."""
        if self.costs is None:
            return None
        post = self.posterior()
        everything = self.space.mask(frozenset(self.candidates))
        confirms = self.costs.hot and self.confirm

        def price(mask: np.ndarray) -> tuple[float, float]:
            subset = self.space.subset(mask)
            seconds = tracker.quote(subset, design.p_fail(mask))
            if waits >= self.costs.launch_s and not tracker.engine_up(subset):
                seconds -= self.costs.launch_s - self.costs.switch_s
            if tracker.seen[subset]:
                return seconds, 0.0  # each counts the first trial only
            row = self._set_row.get((everything - mask).tobytes())
            share = float(post[row]) if row is not None else 0.0
            if confirms and not tracker.engine_up(subset):
                own = self._set_row.get(mask.tobytes())
                share = max(share, float(post[own]) if own is not None else 0.0)
            return seconds, min(share, _MAX_CREDIT)

        return price

    def _design_posterior(self) -> np.ndarray:
        """The posterior the design sees: culprit sets of order k weighted by
        `design_discount`^(k-1), so tests split the simplest explanations first and an
        interaction is chased once the singles are ruled out (docs/bisect.md has the figures).
        The stopping rule always uses the true posterior."""
        post = self.posterior()
        post[: self.space.n_sets] *= self.design_discount ** (self.space.sizes - 1)
        return post / post.sum()

    def _options(self, design: RoundDesign, tracker: CostTracker) -> list[np.ndarray]:
        """Candidate subsets, best first on ties: the top culprit set alone (in the endgame it
        splits the posterior as well as anything and also shows the set fails on its own),
        then greedy constructions from ∅ and from the top set, then the two ends. Priced, also:
        the best construction inside each engine that is up (a hot switch, no launch), and the
        bad end without the top set (the remedy check's configuration)."""
        empty = np.zeros(len(self.candidates), np.uint8)
        everything = self.space.mask(frozenset(self.candidates))
        ends = [empty, everything]
        best = self.top(1)[0][0]
        extra: list[np.ndarray] = []
        if self.costs is not None:
            fixed = self.space.mask(self.costs.load_time & frozenset(self.candidates))
            if self.costs.hot and fixed.any():
                extra = [design.grow(self.space.mask(state), frozen=fixed)
                         for state in tracker.engines]
            if best.is_set:
                extra.append(everything - self.space.mask(best.members))
        if not best.is_set:
            return [design.grow(empty), *ends, *extra]
        alone = self.space.mask(best.members)
        return [alone, design.grow(empty), design.grow(alone), *ends, *extra]

    def _skipped_masks(self) -> set[bytes]:
        return {self.space.mask(s).tobytes() for s in self._skipped}

    def _likelihood(self, mask: np.ndarray, outcome: str, table: np.ndarray) -> np.ndarray:
        """[H + 3] log P(outcome | hypothesis) for one trial of `mask`; `table`: [observed,
        true] log-likelihoods at the rates the trial holds to."""
        if outcome == V.BETWEEN:  # the same under every set and end catch-all
            between = np.zeros(self.space.n_hypotheses)
            if mask.any() and not mask.all():  # `unexplained` keeps ends that behave
                between[-1] = math.log(_BETWEEN_RATIO)
            return between
        obs = 1 if outcome == V.FAIL else 0
        sets = np.where(self.space.contained(mask), table[obs, 1], table[obs, 0])
        if not mask.any():
            other = table[obs, 0]  # `unexplained` still has a passing good end
        elif mask.all():
            other = table[obs, 1]  # ... and a failing bad end
        else:
            other = math.log(0.5)
        return np.concatenate([sets, [table[obs, 1], table[obs, 0], other]])

    def _ends_differ(self) -> bool:
        seen = {r.subset for r in self._records if r.evidence}
        if frozenset() not in seen:
            return False
        if self._bad_end_first and frozenset(self.candidates) not in seen:
            return False
        post = self.posterior()
        return float(post[-3] + post[-2]) <= 1 - self.confidence


@dataclass(frozen=True)
class _Round:
    """A round the search could propose: its subsets, their joint information (bits) and the
    expected seconds of its longest trial."""

    subsets: list[frozenset[str]]
    bits: float
    wall_s: float
    launches: bool  # a trial of it launches an engine

    @property
    def rate(self) -> float:
        return self.bits / max(self.wall_s, 1e-9)


def _bad_end_first(costs: StepCosts | None) -> bool:
    """Whether the bad end is run by itself before the search. Under the model every FAIL is
    evidence against `bad-end-passes` as strong as a FAIL of the bad end (that catch-all passes
    everywhere, and a configuration fails only through a culprit set the bad end contains),
    while no culprit set can be told apart by the bad end. So its own trial is needed only
    where trials are judged against a measurement of it or of the good end's run beside it:
    an engine's paired probe and the sequential trial probe, which measure both ends first at
    full size. A `--test-cmd` verdict stands alone: its bad end is checked by the first trial
    that fails (docs/bisect.md, "Both ends first"), and run when the design asks for it. The
    unpriced design (no costs) keeps both ends first."""
    return costs is None or costs.paired or costs.sequential


__all__ = ["Check", "Noise", "Priors", "Record", "Search", "SearchResult", "Status"]
