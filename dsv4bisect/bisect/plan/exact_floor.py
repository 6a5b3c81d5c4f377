"""The least any search can spend on one node: the exact optimum of the bisect's problem with
noiseless trials (pure; docs/performance.md, issue 42 Part 10).

The plan's world (simulate.py) hides a culprit set C drawn from the flat prior over the sets of
up to `max_order` candidates; a trial of subset S fails iff C <= S, its verdict flipped at the
trial probe's error rates. A trial costs its engine (a hot switch where the engine up holds S's
load-time state, else a launch; one engine on the node) and its probe: the trial probe's share
like the bad end where C <= S, like the good end otherwise (`CostTracker.charge`). The bisect's
rules add the ends first (`floor_run`: both at look 1) and the remedy check, the bad end
without the named set, which a trial the search already ran on it answers (remedy.py).

With noiseless trials this is a finite decision problem over (the culprit sets still
consistent, the load-time state up, the sets whose remedy configuration was tested), solved
exactly by dynamic programming. Any search on noisy trials is a policy of the noiseless
problem too (it can flip the verdicts with a coin of its own: same costs, same chance of naming
the right set), so the noiseless optimum is a floor under every search and every stopping rule.
A search may still name a wrong set with probability `miss`; a policy of the noiseless problem
that may stop early is bounded by Lagrangian relaxation: for every price `lam` on naming a wrong
set, E[seconds] >= V(lam) - miss * lam, V(lam) the optimum of seconds + lam * P(wrong).

What it leaves out, each of which only adds: the noise itself (the repeats and the fresh look a
search needs to be right at 1 % trial errors), look 2 of the ends, the confirmation. One engine
a node (`pool` 1): with more engines the state would be a set of them.

`noisy_floor` puts the noise back, for trials that err at one rate eps either way, with a genie
that keeps the problem finite: the search sees the real noisy verdicts, and the genie tells it of
every flip after the first one (and then the culprit set). A search that ignores the genie is
the real one, so the genie's optimum is a floor under it too. Before the genie speaks, every
culprit set consistent with all verdicts has weight prior x (1 - eps)^t, every one at odds with
exactly one verdict prior x eps (1 - eps)^(t-1), whichever verdict it was, and every other is
out (its second flip would have been told): the belief is two masks of sets. States equal under a
permutation of the candidates that keeps the load-time ones (the flat prior and the costs do not
tell them apart) share one entry of the table. This table takes hours for six candidates
(5.1 M states); tests/benchmarks/genie_floor.c is the same recursion in C, minutes (docs/
performance.md, issue 42 Part 11).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dsv4bisect.bisect.plan.parallel_plan import floor_run
from dsv4bisect.bisect.plan.simulate import Setup
from dsv4bisect.bisect.search.hypotheses import HypothesisSpace, Priors

NONE_UP = -1  # no engine on the node (the ends came from a cache)
# prices on a wrong name tried for the bound at P(correct) < 1, in units of one switched trial
# that passes (a switch and the trial probe like the good end)
LAMBDA_STEPS = (2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)


@dataclass(frozen=True)
class ExactFloor:
    ends_s: float  # the ends at look 1 (floor_run)
    certain_s: float  # ends + the noiseless optimum that always names the right set
    bound_s: float  # ends + the floor for any search right with P >= 1 - miss
    miss: float
    price: float  # the price on a wrong name that gave `bound_s`
    trials: float  # of the certain optimum, the remedy check included, beyond the ends
    launches: float  # of the certain optimum, beyond the ends
    states: int  # of the certain optimum's table
    # per culprit set of the world's prior: (the set, its prior, the certain optimum's trials and
    # launches beyond the ends when it is the culprit set)
    per_set: tuple[tuple[frozenset[str], float, int, int], ...] = ()

    def line(self) -> str:
        return (f"exact floor, noiseless trials, 1 node: {self.bound_s:.0f} s at P(correct) "
                f">= {1 - self.miss:g} (price {self.price:.0f} s on a wrong name), "
                f"{self.certain_s:.0f} s always right = the ends {self.ends_s:.0f} s + "
                f"{self.certain_s - self.ends_s:.0f} s ({self.trials:.2f} trials, the remedy "
                f"check among them, {self.launches:.2f} launches beyond the ends; "
                f"{self.states} states)")


class _Problem:
    """The noiseless problem on bitmasks: candidate i is bit i of a subset, culprit set h bit h
    of a mask of sets."""

    def __init__(self, setup: Setup, sets: Sequence[frozenset[str]], prior: Sequence[float]):
        c = setup.costs
        if c.pool != 1:
            raise ValueError("the exact floor prices one engine a node")
        bit = {name: 1 << i for i, name in enumerate(setup.candidates)}
        self.all = (1 << len(setup.candidates)) - 1
        self.load = sum(bit[n] for n in c.load_time if n in bit)
        self.members = list(sets)
        self.sets = [sum(bit[n] for n in s) for s in sets]
        self.prior = list(prior)
        self.costs = c
        fraction = ((c.like_good_fraction, c.like_bad_fraction) if c.sequential else (1.0, 1.0))
        self.good_s, self.bad_s = (c.probe_s * f for f in fraction)
        # every subset but the two ends, which every set answers alike
        self.tests = [(s, self._fails(s), self._remedy_of(s)) for s in range(1, self.all)]
        self.mass = functools.cache(self._mass)  # a set of culprit sets' prior mass

    def _fails(self, subset: int) -> int:
        return sum(1 << h for h, members in enumerate(self.sets) if members & ~subset == 0)

    def _remedy_of(self, subset: int) -> int:
        """The sets whose remedy configuration (the bad end without them) `subset` is."""
        return sum(1 << h for h, members in enumerate(self.sets) if self.all & ~members == subset)

    def engine_s(self, up: int, state: int) -> float:
        c = self.costs
        return c.switch_s if c.hot and up == state else c.launch_s

    def _mass(self, mask: int) -> float:
        return sum(p for h, p in enumerate(self.prior) if mask >> h & 1)

    @property
    def starts(self) -> list[int]:
        """The engine up after the ends: the bad end's or the good end's state (whichever ran
        last), none where they came from a cache."""
        return [NONE_UP] if self.costs.ends0_cached else [self.load, 0]

    def remedy_s(self, named: int, up: int, done: int, present: int,
                 weigh: Callable[[int], float]) -> float:
        """Seconds of the remedy check of set `named` (the bad end without it) over the sets
        `present`, each weighed by `weigh`: its engine and its probe, like the bad end where
        the set is in it. 0 where a trial already ran it, or nothing is left to switch off."""
        rest = self.all & ~self.sets[named]
        if not rest or done >> named & 1:
            return 0.0
        engine = self.engine_s(up, rest & self.load)
        return sum(weigh(g) * (engine + (self.bad_s if self.sets[g] & ~rest == 0
                                         else self.good_s))
                   for g in range(len(self.sets)) if present >> g & 1)

    def solve(self, price: float) -> tuple[float, dict]:
        """V(price) from every start a bisect's ends can leave, and the table of choices."""
        choice: dict[tuple[int, int, int], tuple] = {}

        @functools.cache
        def value(mask: int, up: int, done: int) -> float:
            m = self.mass(mask)
            best, best_choice = math.inf, None
            for h in range(len(self.sets)):  # stop, naming h, then its remedy check
                if not mask >> h & 1:
                    continue
                wrong = m - self.prior[h]  # 0 where h is the only set left
                cost = ((price * wrong if wrong > 0 else 0.0)
                        + self.remedy_s(h, up, done, mask, self.prior.__getitem__))
                if cost < best:
                    best, best_choice = cost, ("stop", h)
            if mask & (mask - 1):  # two sets or more: a trial may split them
                seen = set()
                for subset, fails, remedy_of in self.tests:
                    f = mask & fails
                    if f in (0, mask):
                        continue
                    state, tested = subset & self.load, done | (remedy_of & mask)
                    if (f, state, tested) in seen:
                        continue
                    seen.add((f, state, tested))
                    p = mask & ~f
                    cost = (m * self.engine_s(up, state) + self.mass(f) * self.bad_s
                            + self.mass(p) * self.good_s)
                    if cost >= best:
                        continue
                    cost += value(f, state, tested & f)
                    if cost >= best:
                        continue
                    cost += value(p, state, tested & p)
                    if cost < best:
                        best, best_choice = cost, ("trial", subset, f, p, state, tested)
            choice[(mask, up, done)] = best_choice
            return best

        full = (1 << len(self.sets)) - 1
        values = {up: value(full, up, 0) for up in self.starts}
        start = min(values, key=values.get)
        choice["start"] = start
        return values[start], choice

    def walk(self, choice: dict, h: int) -> tuple[int, int, int]:
        """The trials and launches of the solved policy when `h` is the culprit set, and the
        set it names."""
        mask, up, done = (1 << len(self.sets)) - 1, choice["start"], 0
        trials = launches = 0
        while True:
            step = choice[(mask, up, done)]
            if step[0] == "stop":
                named = step[1]
                rest = self.all & ~self.sets[named]
                if rest and not done >> named & 1:
                    trials += 1
                    launches += self.engine_s(up, rest & self.load) == self.costs.launch_s
                return trials, launches, named
            _, _, f, _, state, tested = step
            trials += 1
            launches += self.engine_s(up, state) == self.costs.launch_s
            mask = f if f >> h & 1 else mask & ~f
            up, done = state, tested & mask


class _Symmetry:
    """The permutations of the candidates that keep the load-time set, acting on masks of culprit
    sets (7 bits at a time, by table) and on engine states; `canon` is a state's least image."""

    CHUNK = 7

    def __init__(self, problem: _Problem, candidates: int):
        load = [i for i in range(candidates) if problem.load >> i & 1]
        hot = [i for i in range(candidates) if not problem.load >> i & 1]
        index = {members: h for h, members in enumerate(problem.sets)}
        self.tables, self.states = [], []
        self.taus: list[list[int]] = []  # each permutation's image of the culprit sets' indices
        for a, b in itertools.product(itertools.permutations(load), itertools.permutations(hot)):
            sigma = dict(zip(load + hot, a + b, strict=True))

            def image(subset: int, sigma=sigma) -> int:
                return sum(1 << sigma[i] for i in range(candidates) if subset >> i & 1)

            tau = [index[image(members)] for members in problem.sets]
            if any(abs(problem.prior[h] - problem.prior[tau[h]]) > 1e-12 for h in range(len(tau))):
                continue  # a prior that tells them apart: not a symmetry
            self.taus.append(tau)
            self.tables.append([[sum(1 << tau[c * self.CHUNK + k] for k in range(self.CHUNK)
                                     if v >> k & 1 and c * self.CHUNK + k < len(tau))
                                 for v in range(1 << self.CHUNK)]
                                for c in range(-(-len(tau) // self.CHUNK))])
            self.states.append([image(m) for m in range(1 << candidates)])

    def _map(self, table: list[list[int]], mask: int) -> int:
        out, chunk = 0, 0
        while mask:
            out |= table[chunk][mask & ((1 << self.CHUNK) - 1)]
            mask >>= self.CHUNK
            chunk += 1
        return out

    def canon(self, mask0: int, mask1: int, up: int, done: int) -> tuple[int, int, int, int]:
        return min((self._map(t, mask0), self._map(t, mask1), s[up] if up >= 0 else up,
                    self._map(t, done)) for t, s in zip(self.tables, self.states, strict=True))


def _genie_value(problem: _Problem, price: float, eps: float, symmetry: _Symmetry | None
                 ) -> tuple[float, int]:
    """The genie's optimum of seconds + price x P(wrong) from the ends (the module docstring),
    and the states of its table. A belief's masks: `mask0` at one with every verdict, `mask1` at
    odds with one; weights are kept relative, prior x (1 - eps) and prior x eps, each step
    scaling both children by (1 - eps)."""
    prior, n_sets = problem.prior, len(problem.sets)

    @functools.cache
    def weight(mask0: int, mask1: int) -> float:
        return (1 - eps) * problem.mass(mask0) + eps * problem.mass(mask1)

    table: dict[tuple[int, int, int, int], float] = {}

    def value(mask0: int, mask1: int, up: int, done: int) -> float:
        key = (symmetry.canon(mask0, mask1, up, done) if symmetry
               else (mask0, mask1, up, done))
        if key not in table:
            table[key] = compute(*key)
        return table[key]

    def compute(mask0: int, mask1: int, up: int, done: int) -> float:
        both, total = mask0 | mask1, weight(mask0, mask1)

        def weigh(g: int) -> float:
            return (1 - eps if mask0 >> g & 1 else eps) * prior[g]

        best = math.inf
        for h in range(n_sets):  # stop, naming h, then its remedy check
            if not both >> h & 1:
                continue
            cost = (price * (total - weigh(h))
                     + problem.remedy_s(h, up, done, both, weigh))
            best = min(best, cost)
        if both & (both - 1) == 0:
            return best  # one set left: no trial can tell it from another
        seen = set()
        # the most even splits in the engine up first: a good best early prunes the rest
        order = sorted(problem.tests, key=lambda t: (
            abs(2 * weight(mask0 & t[1], mask1 & t[1]) - total)
            + (problem.engine_s(up, t[0] & problem.load) > problem.costs.switch_s) * total))
        for subset, fails, remedy_of in order:
            f0, f1, p0, p1 = mask0 & fails, mask1 & fails, mask0 & ~fails, mask1 & ~fails
            # a FAIL keeps the sets that fail the trial and moves the others at one with every
            # verdict to the one-flip mask; the one-flip sets that pass it leave (a second flip)
            fail, passed = (f0, f1 | p0), (p0, p1 | f0)
            state, tested = subset & problem.load, done | (remedy_of & both)
            if (fail, passed, state, tested) in seen:
                continue
            seen.add((fail, passed, state, tested))
            cost = (total * problem.engine_s(up, state) + weight(f0, f1) * problem.bad_s
                    + weight(p0, p1) * problem.good_s)
            if (mask0, mask1) in (fail, passed):  # one outcome gives this belief back:
                # V <= (cost + (1 - eps) V(the other)) / eps, never near the best where
                # price < (a trial) / eps
                if eps == 0 or cost / eps >= best:
                    continue
                other = passed if fail == (mask0, mask1) else fail
                rest_s = (1 - eps) * value(*other, state, tested & (other[0] | other[1]))
                best = min(best, (cost + rest_s) / eps)
                continue
            lows = [least(*fail), least(*passed)]
            for i, child in enumerate((fail, passed)):
                if cost + (1 - eps) * sum(lows[i:]) >= best:
                    break
                if child[0] | child[1]:
                    cost += (1 - eps) * value(*child, state, tested & (child[0] | child[1]))
            else:
                best = min(best, cost)
        return best

    trial_s = problem.costs.switch_s + min(problem.good_s, problem.bad_s)

    def least(mask0: int, mask1: int) -> float:
        """A floor under `value` that needs no table: the belief is named now, wrong with
        all but its heaviest set's weight, or it pays at least one trial."""
        both = mask0 | mask1
        if not both:
            return 0.0
        heaviest = max((1 - eps if mask0 >> h & 1 else eps) * prior[h]
                       for h in range(n_sets) if both >> h & 1)
        total = weight(mask0, mask1)
        return min(price * (total - heaviest), total * trial_s)

    full = (1 << n_sets) - 1
    # the relative weights start at prior x (1 - eps): the first step's scale
    return min(value(full, 0, up, 0) for up in problem.starts) / (1 - eps), len(table)


# seconds on a wrong name for the genie's bound, where the profiles peak (docs/
# performance.md, issue 42 Part 11): `dsv4-flash-tp8-latest-all` at 6000 s (3656 s; 3630 s at
# 4000 s, 3653 s at 8000 s), `dsv4-flash-tp8-all` at 16000 s (2059 s; 2044 s at 8000 s); any
# price gives a valid floor
GENIE_PRICES = (6000.0, 16000.0)


# the genie's table: (problem, price, error rate, symmetry or None) -> (V(price), states)
GenieSolver = Callable[["_Problem", float, float, "_Symmetry | None"], tuple[float, int]]


def genie_floors(setup: Setup, miss: float = 0.01, prices: tuple[float, ...] = GENIE_PRICES,
                 symmetric: bool = True, solve: GenieSolver | None = None
                 ) -> list[tuple[float, float, int]]:
    """Per price on a wrong name: (the price, the floor under any search on one node at the
    trial probe's error rate (one rate either way) right with P >= 1 - miss, which is the ends
    plus the genie's bound (the module docstring), the states of its table). `solve`: the
    genie's table (default `_genie_value`; tests/benchmarks/genie_floor.c is the same in C)."""
    rate = setup.trial_noise
    if rate.false_fail != rate.false_pass:
        raise ValueError("the genie's floor takes one error rate either way")
    problem = _problem(setup)
    symmetry = _Symmetry(problem, len(setup.candidates)) if symmetric else None
    ends = floor_run(setup, 1, frozenset(setup.candidates))
    rows = []
    for price in prices:
        value, states = (solve or _genie_value)(problem, price, rate.false_fail, symmetry)
        rows.append((price, ends + value - miss * price, states))
    return rows


def noisy_floor(setup: Setup, miss: float = 0.01, prices: tuple[float, ...] = GENIE_PRICES,
                symmetric: bool = True, solve: GenieSolver | None = None
                ) -> tuple[float, float, int]:
    """The best of `genie_floors`: the floor, its price and the states of its table."""
    price, floor, states = max(genie_floors(setup, miss, prices, symmetric, solve),
                               key=lambda row: row[1])
    return floor, price, states


def _problem(setup: Setup) -> _Problem:
    space = HypothesisSpace(setup.candidates, setup.max_order, Priors())  # the world's prior
    prior = np.exp(space.log_prior[: space.n_sets])
    prior = prior / prior.sum()
    sets = [space.hypothesis(i).members for i in range(space.n_sets)]
    return _Problem(setup, sets, [float(p) for p in prior])


def exact_floor(setup: Setup, miss: float = 0.01) -> ExactFloor:
    """The floor under any search on one node for `setup`'s world (the module docstring)."""
    problem = _problem(setup)
    ends = floor_run(setup, 1, frozenset(setup.candidates))
    certain, choice = problem.solve(math.inf)
    per_set = []
    for h, p in enumerate(problem.prior):
        n_trials, n_launches, named = problem.walk(choice, h)
        assert named == h, "the certain optimum names the culprit set"
        per_set.append((problem.members[h], p, n_trials, n_launches))
    trials = sum(p * n for _, p, n, _ in per_set)
    launches = sum(p * n for _, p, _, n in per_set)
    unit = problem.good_s + setup.costs.switch_s
    bound, price = certain, math.inf
    if miss > 0:
        bounds = {step * unit: problem.solve(step * unit)[0] - miss * step * unit
                  for step in LAMBDA_STEPS}
        price = max(bounds, key=bounds.get)
        bound = min(bounds[price], certain)
    return ExactFloor(ends, ends + certain, ends + bound, float(miss), price, trials, launches,
                      len([k for k in choice if k != "start"]), tuple(per_set))
