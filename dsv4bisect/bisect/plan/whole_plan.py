"""`--plan` for the whole bisect: ends, A/A, trials, remedy check and fresh confirmation, priced
as the driver runs them (pricing.py), with and without each lever, from one simulation.

Levers: **hot** switching (off: every trial a fresh launch), the **sequential** trial probe
(off: every trial probed at full size, at the ends' error rates), **priors** from the
microtest (off: the weights without them), the **priced** design (off: information per trial).
Every configuration of the levers runs against the same hidden culprit sets and the same random
outcome streams (common random numbers), so the differences are the levers', not the draw's.
The culprit sets are drawn from a *flat* prior (every candidate the same weight, the search's
order masses): a prior lever judged against culprits drawn from its own prior would always win.
Deterministic given `seed`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dsv4bisect.bisect import remedy as rem
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.hypotheses import HypothesisSpace, Priors
from dsv4bisect.bisect.search.pricing import CostTracker, StepCosts
from dsv4bisect.bisect.search.search import Search, Status
from dsv4bisect.errors import BisectError
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

    def search(self, *, priced: bool, parallel: int = 1) -> Search:
        """The search this bisect runs (`priced=False`: the unpriced design)."""
        return Search(self.candidates, noise=self.noise, confidence=self.confidence,
                      max_trials=self.max_trials, parallel=parallel, max_order=self.max_order,
                      priors=Priors(weights=dict(self.weights)), trial_noise=self.trial_noise,
                      costs=self.costs if priced else None, confirm=self.confirm)

    def without(self, levers: Sequence[str]) -> Setup:
        """The same bisect with `levers` off."""
        out = self
        if "hot" in levers:
            out = replace(out, costs=out.costs.fresh())
        if "sequential" in levers:
            out = replace(out, trial_noise=out.noise, costs=replace(out.costs, sequential=False))
        if "priors" in levers:
            out = replace(out, weights=out.base_weights)
        return out


@dataclass(frozen=True)
class Figures:
    """One configuration of the levers over every simulated bisect."""

    mean_wall_s: float
    p90_wall_s: float
    mean_trials: float  # probe runs, remedy and confirmation included
    mean_launches: float  # engine launches (every trial without hot switching)
    p_correct: float
    phase_s: Mapping[str, float]  # mean seconds per phase (PHASES)


@dataclass(frozen=True)
class WholePlan:
    runs: int
    levers: tuple[str, ...]  # the levers this bisect has (the others cannot be turned on)
    with_levers: Figures
    without_levers: Figures | None  # every lever off: today's bisect, everything counted
    each_off: Mapping[str, Figures]  # one lever off in turn

    def saves_s(self, lever: str) -> float:
        return self.each_off[lever].mean_wall_s - self.with_levers.mean_wall_s


def plan_bisect(setup: Setup, *, trials: int = 100, seed: int = 0,
                compare: bool = True) -> WholePlan:
    """Simulate `trials` whole bisects per configuration of the levers (`compare=False`: only
    with every lever on)."""
    if trials < 1:
        raise BisectError("the plan needs at least one simulated run", "use trials >= 1")
    levers = available_levers(setup)
    culprits, seeds = common_draws(setup, trials, seed)

    def figures(off: Sequence[str]) -> Figures:
        cfg = setup.without(off)
        priced = "priced" not in off
        runs = [_simulate(cfg, c, random.Random(s), priced) for c, s in zip(culprits, seeds)]
        return _figures(runs)

    if not compare:
        return WholePlan(trials, levers, figures(()), None, {})
    return WholePlan(trials, levers, figures(()), figures(levers),
                     {lever: figures((lever,)) for lever in levers})


def available_levers(setup: Setup) -> tuple[str, ...]:
    """The levers this bisect has (the others cannot be turned on)."""
    return tuple(lever for lever in LEVERS if _has(setup, lever))


def common_draws(setup: Setup, trials: int, seed: int) -> tuple[list[frozenset[str]], list[int]]:
    """The hidden culprit sets (flat prior) and the outcome-stream seeds of `trials` simulated
    bisects: the same for every configuration simulated with this `seed` (common random
    numbers; parallel_plan.py draws its node columns from them too)."""
    draw = random.Random(seed)
    flat = HypothesisSpace(setup.candidates, setup.max_order, Priors())
    culprits = [_flat_culprits(flat, draw) for _ in range(trials)]
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


@dataclass(frozen=True)
class _Run:
    wall_s: float
    trials: int
    launches: int
    correct: bool
    phase_s: dict[str, float]


def _simulate(cfg: Setup, culprits: frozenset[str], rng: random.Random, priced: bool) -> _Run:
    everything = frozenset(cfg.candidates)
    search = cfg.search(priced=priced)
    spent = CostTracker(cfg.costs, everything)  # what the trials really cost
    phase = dict.fromkeys(PHASES, 0.0)
    trials = 0
    fresh_fails: set[frozenset[str]] = set()  # failed in an engine launched for them (hot)

    def run(subset: frozenset[str], name: str) -> str:
        nonlocal trials
        fails = culprits <= subset
        end = not subset or subset == everything
        noise = cfg.noise if end else cfg.trial_noise
        phase[name] += spent.charge(subset, fails)
        trials += 1
        flip = rng.random() < (noise.false_pass if fails else noise.false_fail)
        outcome = V.FAIL if fails != flip else V.PASS
        if spent.launched_last and outcome == V.FAIL:
            fresh_fails.add(subset)
        return outcome

    while proposals := search.next():
        for subset in proposals:
            end = not subset or subset == everything
            outcome = run(subset, "ends" if end else "trials")
            search.record(subset, outcome, None if end else cfg.trial_noise)
    result = search.result()
    if result.status is Status.FOUND and result.culprits:
        rem.simulate(cfg.candidates, result.culprits, search.records,
                     lambda subset: run(subset, "remedy"))
        confirmed = frozenset(result.culprits) in fresh_fails  # a search trial was it
        if cfg.costs.hot and cfg.confirm and not confirmed:
            phase["confirmation"] += spent.confirmation(culprits <= result.culprits)
            trials += 1
    correct = result.status is Status.FOUND and result.culprits == culprits
    return _Run(sum(phase.values()), trials, spent.launches, correct, phase)


def _figures(runs: list[_Run]) -> Figures:
    wall = np.array([r.wall_s for r in runs])
    return Figures(
        mean_wall_s=float(wall.mean()),
        p90_wall_s=float(np.quantile(wall, 0.9)),
        mean_trials=float(np.mean([r.trials for r in runs])),
        mean_launches=float(np.mean([r.launches for r in runs])),
        p_correct=sum(r.correct for r in runs) / len(runs),
        phase_s={p: float(np.mean([r.phase_s[p] for r in runs])) for p in PHASES},
    )


def _flat_culprits(space: HypothesisSpace, rng: random.Random) -> frozenset[str]:
    """A culprit set from a flat prior (`space`: the search's order masses, every candidate
    alike)."""
    prior = np.exp(space.log_prior[: space.n_sets])
    cumulative = np.cumsum(prior / prior.sum())
    row = int(np.searchsorted(cumulative, rng.random(), side="right"))
    return space.hypothesis(min(row, space.n_sets - 1)).members
