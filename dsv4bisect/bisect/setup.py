"""A bisect of a profile assembled before anything launches: the runner of this machine, the
noise (given, measured in the ledger, or the default), every cost with its source, the spec and
its simulated plan. `cli/bisect.py` is parse → `prepare` → drive → render; the microtest priors
(cli/bisect_priors.py, which shows its progress) come in between through `with_weights`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dsv4bisect.bisect.ledger import Ledger, NoiseEstimate
from dsv4bisect.bisect.plan.costs import PlanCosts, plan_costs, probe_shape, sequential_from_probe
from dsv4bisect.bisect.plan.simulate import Setup
from dsv4bisect.bisect.plan.whole_plan import WholePlan, plan_bisect
from dsv4bisect.bisect.question import Question
from dsv4bisect.bisect.search.design import DEFAULT_NOISE, Noise
from dsv4bisect.bisect.search.hypotheses import tier_weights
from dsv4bisect.bisect.search.pricing import StepCosts
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.bisect.trials.runner import Runner
from dsv4bisect.bisect.trials.testcmd import TestCommandRunner
from dsv4bisect.errors import BisectError
from dsv4bisect.probe.sequential import TRIAL_ERROR_RATES
from dsv4bisect.run.events import EventSink, ignore


@dataclass(frozen=True)
class Asked:
    """What the command line asked; None: the profile's `bisect` setting (or its default)."""

    ledger: Path
    tier: str | None = None
    confidence: float | None = None
    max_trials: int | None = None
    parallel: int | None = None
    warn_as: str | None = None
    drift: str | None = None
    test_cmd: str | None = None
    false_fail: float | None = None
    false_pass: float | None = None
    costs: dict[str, float | None] = field(default_factory=dict)  # launch, switch, probe
    fresh_launches: bool = False
    confirm: bool = True
    use_cache: bool = True
    executor: str | None = None
    ray_address: str | None = None


@dataclass(frozen=True)
class Prepared:
    question: Question
    placement: dict[str, Any]  # executor, ray_address, node_resource
    request: RunnerRequest  # what a node (or a resume) rebuilds its runner from
    runner: Runner  # this machine's: the engine runner, or the test command's
    engine: EngineRunner | None  # the engine runner; None with a test command
    noise: Noise
    noise_source: str  # given | measured: ... | default | partly given
    costs: PlanCosts
    spec: BisectSpec

    def with_weights(self, weights: dict[str, float]) -> Prepared:
        """The same bisect with these prior weights (the microtest priors applied)."""
        return replace(self, spec=replace(self.spec, weights=weights))

    def setup(self) -> Setup:
        """The simulated bisect of the spec, with every lever it has on."""
        s = self.spec
        return Setup(s.candidates, s.noise, s.trial_noise or s.noise, s.costs or StepCosts(),
                     s.confidence, s.max_order, s.max_trials, dict(s.weights),
                     tier_priors(self.question), s.confirm)

    def plan(self, trials: int, compare: bool) -> WholePlan:
        return plan_bisect(self.setup(), trials=trials, compare=compare)


def prepare(question: Question, asked: Asked, on_event: EventSink = ignore) -> Prepared:
    cfg = question.bisect
    placement = {"executor": asked.executor or cfg.executor,
                 "ray_address": asked.ray_address or cfg.ray_address,
                 "node_resource": cfg.node_resource}
    # One machine keeps one pool of hot engines and runs its trials one at a time, so local
    # rounds of K > 1 launch fresh; on Ray each node keeps its own (docs/cluster.md).
    rounds = asked.parallel if asked.parallel is not None else cfg.parallel
    hot = not asked.fresh_launches and (placement["executor"] == "ray" or rounds == 1)
    # Relative by default where it applies: a bad end that only drifts is bisected on drift
    # against the two ends (docs/bisect.md, "Drift and WARN").
    drift = asked.drift or cfg.drift or ("relative" if hot and asked.test_cmd is None
                                         else "absolute")
    if drift == "relative" and (not hot or asked.test_cmd is not None):
        raise BisectError("--drift relative judges the sequential trial probe of a hot "
                          "bisect", "drop --fresh-launches, --parallel K > 1 (local) and "
                          "--test-cmd, or use --drift absolute")
    warn_as = asked.warn_as or cfg.warn_as
    request = RunnerRequest(question.profile, question.good, tuple(question.sets), asked.tier,
                            asked.use_cache, bad=bad_end(question),
                            load_time=tuple(question.load_time), hot=hot, warn_as=warn_as,
                            drift=drift)
    engine: EngineRunner | None = None
    runner: Runner
    if asked.test_cmd is None:
        runner = engine = node_runner(request, on_event)
    else:
        # its working directory is recorded: `--resume` from elsewhere runs it there too
        runner = TestCommandRunner(asked.test_cmd, cwd=os.getcwd())
    measured, durations, details = _history(runner, asked.ledger)
    noise, where = _noise(measured, asked.false_fail, asked.false_pass)
    costs = _costs(engine, question, noise, details, durations, asked.costs, hot)
    spec = BisectSpec(
        candidates=question.candidates, good=question.good, bad=question.bad, noise=noise,
        confidence=asked.confidence if asked.confidence is not None else cfg.confidence,
        max_trials=asked.max_trials if asked.max_trials is not None else cfg.max_trials,
        parallel=rounds, weights=tier_priors(question), warn_as=warn_as,
        trial_noise=costs.trial_noise if costs.costs.sequential else None,
        costs=costs.costs,
        # the Ray executor cannot launch fresh: no confirmation to run, price or plan for
        confirm=asked.confirm and placement["executor"] != "ray")
    return Prepared(question, placement, request, runner, engine, noise, where, costs, spec)


def bad_end(q: Question) -> dict[str, str]:
    """The patch set of the full candidate set (the bad end as the search names it)."""
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)
    return spec.patches_for(frozenset(q.candidates))


def tier_priors(q: Question) -> dict[str, float]:
    """Prior weights by patch tier, with the profile's `bisect.priors` over them."""
    weights = tier_weights(q.tiers)
    weights.update({k: v for k, v in (q.bisect.priors or {}).items() if k in weights})
    return weights


def _history(runner: Runner, ledger_path: Path
             ) -> tuple[NoiseEstimate | None, list[float], list[dict[str, Any]]]:
    """What the ledger measured with this probe before: noise rates, trial wall times and the
    trials' details (measured launch, switch and probe seconds)."""
    if not ledger_path.exists():  # --plan creates nothing
        return None, [], []
    with Ledger.open_readonly(ledger_path) as ledger:  # no lock: a running bisect may hold it
        return (ledger.measured_noise(runner.probe_hash),
                ledger.trial_durations(runner.probe_hash),
                ledger.trial_details(runner.probe_hash))


def _noise(measured: NoiseEstimate | None, ff: float | None,
           fp: float | None) -> tuple[Noise, str]:
    base = measured.noise(fallback=DEFAULT_NOISE) if measured else DEFAULT_NOISE
    noise = Noise(base.false_fail if ff is None else ff, base.false_pass if fp is None else fp)
    if ff is not None and fp is not None:
        return noise, "given"
    if measured and (measured.good_runs >= 5 or measured.bad_runs >= 5):
        return noise, (f"measured: {measured.good_runs} runs known good, {measured.bad_runs} "
                       "known bad")
    return noise, "default" if ff is None and fp is None else "partly given"


def _costs(runner: EngineRunner | None, q: Question, noise: Noise,
           details: list[dict[str, Any]], durations: list[float],
           given: dict[str, float | None], hot: bool) -> PlanCosts:
    """Every cost the plan and the priced design use, each with its source (plan/costs.py):
    given; else measured in the ledger for this probe; else assumed per engine kind and tier."""
    if runner is None:  # a test command: nothing to assume about an engine
        return plan_costs(None, None, given=given, durations=durations)
    engine = "reference" if runner.good_cfg.kind == "reference" else "sglang"
    trial = Noise(*TRIAL_ERROR_RATES)  # what the hot runner asks of its sequential trials
    return plan_costs(engine, probe_shape(runner.spec), given=given, details=details,
                      load_time=tuple(q.load_time), hot=hot, noise=noise,
                      sequential=sequential_from_probe(runner.spec, trial) if hot else None)
