"""`--plan`: simulate the search before anything launches.

Hidden culprit sets are drawn from the search's own prior (singles and pairs, by the risk
weights), outcomes from a probe with the given error rates; the search runs to the end exactly
as it would against the engine. Deterministic given `seed`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dsv4bisect.bisect.search.design import Noise, capacity
from dsv4bisect.bisect.search.hypotheses import Priors
from dsv4bisect.bisect.search.search import DEFAULT_PRIORS, NOISELESS, Search, SearchResult, Status
from dsv4bisect.errors import BisectError
from dsv4bisect.probe import verdict as V


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


@dataclass(frozen=True)
class Plan:
    n_candidates: int
    noise: Noise
    runs: int
    mean_launches: float  # every launch, the end checks included
    p90_launches: float
    max_launches: int
    mean_wall_s: float
    p90_wall_s: float
    p_correct: float  # found exactly the hidden culprit set
    p_ends_separated: float  # the ends were known to differ within the budget
    end_checks_needed: int  # end checks to separate the ends on evidence alone (no prior)
    bits_per_trial: float  # the probe's capacity; 1.0 when noiseless
    warning: str | None


def oracle_outcome(
    subset: frozenset[str], culprits: frozenset[str], noise: Noise, rng: random.Random
) -> str:
    """A probe with the given error rates on the monotone model."""
    if culprits <= subset:
        return V.PASS if rng.random() < noise.false_pass else V.FAIL
    return V.FAIL if rng.random() < noise.false_fail else V.PASS


def simulate(
    search: Search, culprits: frozenset[str], noise: Noise, rng: random.Random
) -> SimulatedRun:
    """Run `search` to the end against a simulated probe."""
    rounds = 0
    while proposals := search.next():
        rounds += 1
        for subset in proposals:
            search.record(subset, oracle_outcome(subset, culprits, noise, rng))
    return SimulatedRun(culprits, search.result(), search.trials_used, rounds, search.ends_known)


def sample_culprits(search: Search, rng: random.Random) -> frozenset[str]:
    """A culprit set drawn from the search's prior over culprit sets."""
    space = search.space
    prior = np.exp(space.log_prior[: space.n_sets])
    cumulative = np.cumsum(prior / prior.sum())
    row = int(np.searchsorted(cumulative, rng.random(), side="right"))
    return space.hypothesis(min(row, space.n_sets - 1)).members


def plan(
    n_candidates: int,
    noise: Noise = NOISELESS,
    launch_cost_s: float = 300.0,
    probe_cost_s: float = 120.0,
    confidence: float = 0.95,
    parallel: int = 1,
    max_order: int = 2,
    *,
    trials: int = 100,
    seed: int = 0,
    max_trials: int | None = None,
    priors: Priors = DEFAULT_PRIORS,
    candidates: Sequence[str] | None = None,
) -> Plan:
    """Expected launches, wall time and P(correct) for a bisect with these settings."""
    names = tuple(candidates) if candidates is not None else _names(n_candidates)
    if len(names) != n_candidates:
        raise BisectError(f"{len(names)} names for {n_candidates} candidates", None)
    if trials < 1:
        raise BisectError("the plan needs at least one simulated run", "use trials >= 1")
    rng = random.Random(seed)
    runs = []
    for _ in range(trials):
        search = Search(
            names,
            noise=noise,
            confidence=confidence,
            max_trials=max_trials,
            parallel=parallel,
            max_order=max_order,
            priors=priors,
        )
        runs.append(simulate(search, sample_culprits(search, rng), noise, rng))
    launches = np.array([r.trials for r in runs], dtype=float)
    wall = np.array([r.rounds for r in runs], dtype=float) * (launch_cost_s + probe_cost_s)
    p_correct = sum(r.correct for r in runs) / len(runs)
    p_ends = sum(r.ends_separated for r in runs) / len(runs)
    bits = capacity(noise)
    ends = end_checks_needed(noise, confidence)
    return Plan(
        n_candidates=n_candidates,
        noise=noise,
        runs=len(runs),
        mean_launches=float(launches.mean()),
        p90_launches=float(np.quantile(launches, 0.9)),
        max_launches=int(launches.max()),
        mean_wall_s=float(wall.mean()),
        p90_wall_s=float(np.quantile(wall, 0.9)),
        p_correct=p_correct,
        p_ends_separated=p_ends,
        end_checks_needed=ends,
        bits_per_trial=bits,
        warning=_warning(p_ends, ends, p_correct, bits, confidence, max_trials, launches),
    )


def end_checks_needed(noise: Noise, confidence: float) -> int:
    """Trials at the two ends (alternating) until their outcomes alone, with no prior, tell
    good from bad at `confidence`: log-odds needed / expected log-likelihood ratio per trial."""
    a, b = noise.false_fail, 1 - noise.false_pass  # P(FAIL) at the good end, at the bad end
    if a >= b:
        return 10**9
    eps = 1e-12

    def kl(p: float, q: float) -> float:
        p, q = min(max(p, eps), 1 - eps), min(max(q, eps), 1 - eps)
        return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))

    per_trial = (kl(a, b) + kl(b, a)) / 2
    return max(2, math.ceil(math.log(confidence / (1 - confidence)) / per_trial))


def _warning(
    p_ends: float,
    ends: int,
    p_correct: float,
    bits: float,
    confidence: float,
    max_trials: int | None,
    launches: np.ndarray,
) -> str | None:
    budget = max_trials if max_trials is not None else 100
    if ends > budget or p_ends < 0.95:
        return (
            f"the probe cannot separate the good and bad ends within {budget} trials "
            f"(about {ends} end checks needed); use a stronger probe tier"
        )
    if bits < 0.1:
        return f"the probe carries {bits:.2f} bits per trial; expect a very long search"
    if p_correct < confidence - 0.05:
        return (
            f"only {p_correct:.0%} of simulated runs name the right culprit; raise "
            "--max-trials or --confidence"
        )
    if max_trials is not None and float((launches >= max_trials).mean()) > 0.05:
        return f"{(launches >= max_trials).mean():.0%} of simulated runs hit --max-trials"
    return None


def _names(n: int) -> tuple[str, ...]:
    width = max(2, math.ceil(math.log10(n + 1)))
    return tuple(f"p{i:0{width}d}" for i in range(n))
