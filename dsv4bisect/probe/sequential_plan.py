"""What a sequential trial probe costs, by simulation with the real test (pure, seeded).

`plan_trial(spec, false_fail, false_pass)` is what the bisect's `--plan` prices a trial with:
ends drawn for the spec's grid (the good end right with `good_accuracy`, a bad end losing
`loss_rate` of its right answers), a trial that truly behaves like the good end and one like
the bad end, each run through `SequentialTrial` to its decision. The same world model drives
the simulation test (tests/probe/test_sequential_sim.py), with the good end's accuracy per
cell from a measured embedded run.

Cost model: a request costs its prompt tokens plus `request_overhead_tokens`, a per-request
constant in prompt-token equivalents for the answer's decode steps and the round trip (default
4096: ~40 decoded tokens at ~100 prompt tokens each). The full probe's cost is every accuracy
request of the tier plus its drift transcripts; the sequential probe always scores every drift
transcript first, then the accuracy requests it draws.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dsv4bisect.probe.grid import Cell, cells
from dsv4bisect.probe.judge import drift_gate
from dsv4bisect.probe.sequential import (
    DEFAULT_BATCH,
    Decision,
    DriftFigures,
    EndCase,
    SequentialTrial,
    TrialEnds,
    condition_groups,
    run_offline,
)
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.probe.verdict import BETWEEN, FAIL, PASS

REQUEST_OVERHEAD_TOKENS = 4096
# What a bisect's plan prices its trials at (bisect/plan/costs.py): the smallest loss of facts in
# the verdict table, about 14 % of the answers the good end gets right (issue 42), so that the
# trial probe's size and errors hold for every fault the table has, not only for a 30 % loss;
# 400 simulated trials each way, so that none wrong states an error rate under 1 % (Wilson's
# 95 % upper bound: 0.0095).
SMALLEST_LOSS = 0.14
PLAN_SIMS = 400


@dataclass(frozen=True)
class SimCell:
    """One grid cell of the simulated world (the truth the ends are drawn from)."""

    cell: str
    family: str
    length: int
    cases: int
    accuracy: float  # P(right) of the good configuration
    arm: str = "cold"
    concurrency: int = 1  # the level its requests run at (above 1: sent in groups)


@dataclass(frozen=True)
class DriftFault:
    """A fault's drift against the good end (kl nats, top-1 agreement); each run's figure
    scatters around it by a factor exp(N(0, 0.3)) on KL and on the top-1 shortfall."""

    kl_mean: float
    top1_agreement: float


@dataclass(frozen=True)
class Scenario:
    """How the bad end (and a trial like it) differs from the good end."""

    loss_rate: float = 0.3  # share of the good configuration's right answers the fault loses
    fault_lengths: tuple[int, ...] | None = None  # only in cells of these lengths (None: all)
    noise_flip: float = 0.0  # every run's own per-request flip rate (0: deterministic engine)
    reproduce: bool = True  # a like-bad trial loses the bad end's own cases (else fresh draws)
    benign_flip: float = 0.0  # extra symmetric flips of a like-good trial (harmless numerics)
    drift: DriftFault | None = None  # the fault's drift (None: no drift difference)


def spec_cells(spec: ProbeSpec, accuracy: float | Callable[[Cell], float]) -> list[SimCell]:
    """The spec's accuracy grid under every condition (arm, concurrency) it runs, as a
    sequential trial replays it, with the good configuration's accuracy per cell."""
    acc = accuracy if callable(accuracy) else (lambda _c, a=float(accuracy): a)
    return [SimCell(c.key, c.family, c.length, n, acc(c), arm, level)
            for arm, level in spec.conditions()
            for c, n in cells(spec) if c.family != "drift" and spec.arm_takes(arm, c.family)]


def _groups(world: Sequence[SimCell], rng: random.Random) -> dict[tuple[int, int], tuple[int, int]]:
    """(place, group) of each (cell index, case index) at a level above 1: the level's cases
    in a seeded shuffle (the fixed probe's submission order), cut by `condition_groups`."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for level in sorted({w.concurrency for w in world if w.concurrency > 1}):
        sent = [(k, i) for k, w in enumerate(world) if w.concurrency == level
                for i in range(w.cases)]
        rng.shuffle(sent)
        groups = condition_groups(len(sent), level)
        out |= {key: (p, groups[p]) for p, key in enumerate(sent)}
    return out


def drift_lengths(spec: ProbeSpec) -> list[int]:
    return [c.length for c, n in cells(spec) if c.family == "drift" for _ in range(n)]


def _flip(x: bool, rate: float, rng: random.Random) -> bool:
    return (not x) if rate and rng.random() < rate else x


def _drift_figure(fault: DriftFault | None, rng: random.Random) -> DriftFigures:
    kl, top1 = 0.0, 1.0
    if fault is not None:
        kl = fault.kl_mean * rng.lognormvariate(0.0, 0.3)
        top1 = max(0.0, 1.0 - (1.0 - fault.top1_agreement) * rng.lognormvariate(0.0, 0.3))
    status, _ = drift_gate(kl, top1, 0.0, 1.0)  # deterministic A/A: the absolute floors
    return DriftFigures(status, "all positions", kl, top1, {"all positions": (kl, top1)})


def simulate(world: Sequence[SimCell], scenario: Scenario, truth: str, *, false_fail: float,
             false_pass: float, rng: random.Random, drift_requests: int = 0,
             drift_tokens: int = 0, batch: int = DEFAULT_BATCH) -> Decision:
    """One trial: draw the ends and a trial that truly behaves like `truth` ("good"/"bad"),
    run the sequential test on them, return its decision."""
    if truth not in ("good", "bad"):
        raise ValueError("truth is 'good' or 'bad'")
    s = scenario
    ends: list[EndCase] = []
    answers: dict[tuple[str, str], tuple[bool, Sequence[str]]] = {}
    place = _groups(world, rng)
    for k, cell in enumerate(world):
        q = s.loss_rate if s.fault_lengths is None or cell.length in s.fault_lengths else 0.0
        for i in range(cell.cases):
            right = rng.random() < cell.accuracy  # the good configuration's latent answer
            lost = right and rng.random() < q
            good = _flip(right, s.noise_flip, rng)
            repeat = _flip(right, s.noise_flip, rng)
            bad = _flip(right and not lost, s.noise_flip, rng)
            if truth == "good":
                trial = _flip(_flip(right, s.noise_flip, rng), s.benign_flip, rng)
            else:
                trial_lost = lost if s.reproduce else (right and rng.random() < q)
                trial = _flip(right and not trial_lost, s.noise_flip, rng)
            position, group = place.get((k, i), (0, 0))
            case = EndCase(f"{cell.cell}/{i}", cell.arm, cell.cell, cell.family, cell.length,
                           cell.length, rng.getrandbits(40), good, bad, repeat,
                           concurrency=cell.concurrency, group=group, position=position)
            ends.append(case)
            answers[case.key] = (trial, ())
    bad_drift = _drift_figure(s.drift, rng)
    trial_drift = _drift_figure(s.drift if truth == "bad" else None, rng)
    test = SequentialTrial(TrialEnds(tuple(ends), bad_drift, drift_requests, drift_tokens),
                           false_fail, false_pass, seed=rng.getrandbits(32), batch=batch)
    return run_offline(test, trial_drift, answers)


@dataclass(frozen=True)
class SimSummary:
    """Decisions of many simulated trials of one truth."""

    truth: str
    sims: int
    wrong: float  # share decided for the other end
    between: float  # share at the cap with no decision
    mean_requests: float
    mean_cost: float  # prompt tokens + per-request overhead, per trial

    @property
    def right(self) -> float:
        return 1.0 - self.wrong - self.between


def summarise(decisions: Sequence[Decision], truth: str, cost: Callable[[Decision], float]
              ) -> SimSummary:
    wrong_verdict = FAIL if truth == "good" else PASS
    n = len(decisions)
    return SimSummary(truth, n, sum(d.verdict == wrong_verdict for d in decisions) / n,
                      sum(d.verdict == BETWEEN for d in decisions) / n,
                      sum(d.requests for d in decisions) / n,
                      sum(cost(d) for d in decisions) / n)


@dataclass(frozen=True)
class TrialProbePlan:
    """Expected size of a sequential trial probe, as a share of the full probe's cost."""

    mean_requests_good: float
    mean_requests_bad: float
    cost_fraction_good: float
    cost_fraction_bad: float
    false_fail: float
    false_pass: float
    full_requests: int  # accuracy requests (every condition) + drift transcripts, full size
    between_good: float  # share of simulated trials that reached the cap undecided
    between_bad: float
    sims: int
    request_overhead_tokens: int
    loss_rate: float = 0.3  # the bad end's (and a like-bad trial's) loss simulated
    wrong_good: float = 0.0  # share of like-good trials decided like bad (FAIL)
    wrong_bad: float = 0.0  # share of like-bad trials decided like good (PASS)


def plan_trial(spec: ProbeSpec, false_fail: float, false_pass: float, loss_rate: float = 0.3,
               good_accuracy: float | Mapping[str, float] = 0.9, *, sims: int = 100,
               seed: int = 0, batch: int = DEFAULT_BATCH,
               request_overhead_tokens: int = REQUEST_OVERHEAD_TOKENS) -> TrialProbePlan:
    """Expected requests and cost (a fraction of the full probe's) of a trial that truly
    behaves like the good end, and of one like a bad end losing `loss_rate` of the good end's
    right answers, at the given error rates, by `sims` seeded simulations each.

    `good_accuracy`: the good end's P(right), one figure or one per family (e.g. {"needle":
    0.99, "copy": 0.95, "vartrack": 0.5}). The engine is taken as deterministic and the fault
    as spread over every cell; tests/probe/test_sequential_sim.py covers the other worlds.
    """
    table = (dict(good_accuracy) if isinstance(good_accuracy, Mapping)
             else {f: float(good_accuracy) for f in spec.accuracy_families})

    def acc(cell: Cell) -> float:
        return table[cell.family]

    world = spec_cells(spec, acc)
    drift = drift_lengths(spec)
    drift_tokens = sum(drift)

    def cost(d: Decision) -> float:
        return d.prompt_tokens + d.requests * request_overhead_tokens

    # The full probe asks every accuracy case under each of its conditions (arm × level); a
    # trial draws from all of them (`spec_cells`), a concurrency group as a whole.
    full = (sum((w.length + request_overhead_tokens) * w.cases for w in world)
            + drift_tokens + len(drift) * request_overhead_tokens)
    scenario = Scenario(loss_rate=loss_rate)
    rng = random.Random(seed)
    out = {}
    for truth in ("good", "bad"):
        decisions = [simulate(world, scenario, truth, false_fail=false_fail,
                              false_pass=false_pass, rng=rng, drift_requests=len(drift),
                              drift_tokens=drift_tokens, batch=batch) for _ in range(sims)]
        out[truth] = summarise(decisions, truth, cost)
    return TrialProbePlan(
        out["good"].mean_requests, out["bad"].mean_requests, out["good"].mean_cost / full,
        out["bad"].mean_cost / full, false_fail, false_pass,
        sum(w.cases for w in world) + len(drift), out["good"].between,
        out["bad"].between,
        sims, request_overhead_tokens, loss_rate, out["good"].wrong, out["bad"].wrong)
