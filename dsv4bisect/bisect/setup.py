"""A bisect of a profile assembled before anything launches: what the command line asked
(`BisectRequest`), the trial policy resolved from it once (dsv4bisect/policy.py: the command line
over the profile's `bisect` block), the runner of this machine, the noise (given, measured in the
ledger, or the default), every cost with its source, the spec and its simulated plan.
bisect/session.py calls `prepare`; the microtest priors (cli/bisect_priors.py, which shows its
progress) come in after it through `with_weights`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dsv4bisect.bisect.end_looks import look_spec
from dsv4bisect.bisect.ledger import Ledger, NoiseEstimate
from dsv4bisect.bisect.plan.costs import (
    PlanCosts,
    plan_costs,
    probe_shape,
    sequential_from_probe,
)
from dsv4bisect.bisect.plan.simulate import Setup
from dsv4bisect.bisect.plan.whole_plan import WholePlan, plan_bisect
from dsv4bisect.bisect.question import Question
from dsv4bisect.bisect.search.design import DEFAULT_NOISE, Noise
from dsv4bisect.bisect.search.hypotheses import tier_weights
from dsv4bisect.bisect.search.pricing import StepCosts, ends_seconds
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.bisect.trials.runner import Runner
from dsv4bisect.bisect.trials.testcmd import TestCommandRunner
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.config.schema import BisectSettings
from dsv4bisect.errors import BisectError, ConfigError
from dsv4bisect.policy import DriftRule, Executor, TrialPolicy, WarnAs
from dsv4bisect.probe.sequential import TRIAL_ERROR_RATES
from dsv4bisect.run import baseline as baseline_cache
from dsv4bisect.run.events import EventSink, ignore
from dsv4bisect.run.session import DEFAULT_PROFILE

LEDGER = "ledger.sqlite"  # in the runs root unless asked: shared, so no bisect repeats a trial


@dataclass(frozen=True)
class BisectRequest:
    """What `dsv4bisect bisect` was asked, as one value (the command line builds it; the
    session runs it). None: the profile's `bisect` setting (or its default)."""

    profile: str = DEFAULT_PROFILE
    overrides: Overrides = field(default_factory=Overrides)
    # the question: one profile's ends (`good`, `bad`: patch sets), two configurations, or an
    # upgrade; `candidates` restricts it
    good: str | None = None
    bad: str | None = None
    candidates: str | None = None
    good_config: str | None = None
    bad_config: str | None = None
    upgrade_from: str | None = None
    # the search, its trials and their policy
    tier: str | None = None
    confidence: float | None = None
    max_trials: int | None = None
    parallel: int | None = None
    warn_as: WarnAs | None = None
    drift: DriftRule | None = None
    test_cmd: str | None = None
    false_fail: float | None = None
    false_pass: float | None = None
    costs: dict[str, float | None] = field(default_factory=dict)  # launch, switch, probe
    fresh_launches: bool = False
    confirm: bool = True
    use_cache: bool = True
    microtest_priors: bool | None = None
    # where trials run
    executor: Executor | None = None
    ray_address: str | None = None
    nodes: int | None = None
    shard: bool = True
    full_ends: bool | None = None  # None: the profile's bisect.full_ends
    # what the command does
    plan_only: bool = False
    preflight: bool = True
    resume: Path | None = None
    runs_root: Path = Path("runs")
    ledger_path: Path | None = None
    command: tuple[str, ...] = ()  # argv as typed, for the run file

    @property
    def ledger(self) -> Path:
        return self.ledger_path or self.runs_root / LEDGER

    @property
    def two_configurations(self) -> bool:
        """The ends are not one profile's patch sets (trials run the good end's profile)."""
        return bool(self.good_config or self.bad_config or self.upgrade_from)


@dataclass(frozen=True)
class Prepared:
    question: Question
    request: RunnerRequest  # the run's request, with the trial policy resolved once here
    runner: Runner  # this machine's: the engine runner, or the test command's
    engine: EngineRunner | None  # the engine runner; None with a test command
    noise: Noise
    noise_source: str  # given | measured: ... | default | partly given
    costs: PlanCosts
    spec: BisectSpec
    # why the ends are probed in one look where the policy would look twice (None: as asked)
    ends_note: str | None = None

    def with_weights(self, weights: dict[str, float]) -> Prepared:
        """The same bisect with these prior weights (the microtest priors applied)."""
        return replace(self, spec=replace(self.spec, weights=weights))

    def setup(self) -> Setup:
        """The simulated bisect of the spec, with every lever it has on."""
        s = self.spec
        return Setup(s.candidates, s.noise, s.trial_noise or s.noise, s.costs or StepCosts(),
                     s.confidence, s.max_order, s.max_trials, dict(s.weights),
                     tier_priors(self.question), s.confirm,
                     self.costs.look1 if s.costs is not None and s.costs.looks else None)

    def plan(self, trials: int, compare: bool) -> WholePlan:
        return plan_bisect(self.setup(), trials=trials, compare=compare)


def prepare(question: Question, asked: BisectRequest, on_event: EventSink = ignore) -> Prepared:
    cfg = question.bisect
    rounds = asked.parallel if asked.parallel is not None else cfg.parallel
    policy = trial_policy(asked, cfg, rounds)
    request = RunnerRequest(
        question.profile, question.good, tuple(question.sets), asked.tier, asked.use_cache,
        bad=bad_end(question), run_bad=run_bad_end(question),
        load_time=tuple(question.load_time), policy=policy,
        # its working directory is recorded: `--resume` from elsewhere runs it there too
        test_cmd=asked.test_cmd, test_cwd=os.getcwd() if asked.test_cmd is not None else None,
        ray_address=asked.ray_address or cfg.ray_address, node_resource=cfg.node_resource,
        nodes=_node_slots(asked.nodes, rounds, policy), left_out=question.left_out,
        good_config=asked.good_config, command=asked.command)
    engine: EngineRunner | None = None
    runner: Runner
    if asked.test_cmd is None:
        runner = engine = node_runner(request, on_event)
    else:
        runner = TestCommandRunner(asked.test_cmd, cwd=request.test_cwd)
    measured, durations, details = _history(runner, asked.ledger)
    noise, where = _noise(measured, asked.false_fail, asked.false_pass)
    run = engine.run_cache() if engine is not None and asked.use_cache else None
    ends_cached = run.bad.created_at if run is not None else None

    def good_cached(looks: bool) -> str | None:
        # a cached good end alone does not travel to Ray nodes (a run's ends do: the driver
        # sends them, cluster/shared_ends.py `keep_run`), so it is priced on this machine only
        return (_good_cached(engine, looks) if asked.use_cache and ends_cached is None
                and policy.executor is Executor.LOCAL else None)

    def costs_of(looks: bool, good: str | None) -> PlanCosts:
        return _costs(engine, question, noise, details, durations, asked.costs, policy.hot,
                      looks, ends_cached, good)

    costs = costs_of(policy.end_looks, good_cached(policy.end_looks))
    ends_note = None
    if policy.end_looks and asked.full_ends is None and not cfg.full_ends:
        # two looks where they are priced cheaper than one (docs/bisect.md, "Ends that stop
        # when their question is answered": look 2 costs both ends' engines again). The ends'
        # price needs no trial probe: the full tier's costs are made only where they win
        good_full = good_cached(False)  # one cache lookup for the price and the costs
        one_look = replace(costs.costs.full_ends(), good0_cached=good_full is not None)
        everything = frozenset(question.candidates)
        looks_s = ends_seconds(costs.costs, everything)
        full_s = ends_seconds(one_look, everything)
        if full_s < looks_s:
            ends_note = (
                f"one look at the full tier: look 1 would settle the verdict table's smallest "
                f"loss with P {1 - costs.costs.look2_chance:.2f} only, and look 2 probes both "
                f"ends again in their engines (expected {looks_s:.0f} s for the ends in two "
                f"looks, {full_s:.0f} s in one)")
            policy = replace(policy, full_ends=True)
            request = replace(request, policy=policy)
            if engine is not None:
                engine.close()
                runner = engine = node_runner(request, on_event)
            costs = costs_of(False, good_full)
    spec = BisectSpec(
        candidates=question.candidates, good=question.good, bad=question.bad, noise=noise,
        confidence=asked.confidence if asked.confidence is not None else cfg.confidence,
        max_trials=asked.max_trials if asked.max_trials is not None else cfg.max_trials,
        parallel=rounds, weights=tier_priors(question),
        trial_noise=costs.trial_noise if costs.costs.sequential else None,
        costs=costs.costs,
        # the Ray executor cannot launch fresh: no confirmation to run, price or plan for
        confirm=asked.confirm and policy.executor is not Executor.RAY)
    return Prepared(question, request, runner, engine, noise, where, costs, spec, ends_note)


def trial_policy(asked: BisectRequest, cfg: BisectSettings, rounds: int) -> TrialPolicy:
    """The trial policy, resolved once: each field the command line's, else the profile's,
    else its default (docs/bisect.md, "The trial policy")."""
    executor = Executor(asked.executor or cfg.executor)
    # One machine keeps one pool of hot engines and runs its trials one at a time, so local
    # rounds of K > 1 launch fresh; on Ray each node keeps its own (docs/cluster.md). A test
    # command runs no engine at all.
    hot = (asked.test_cmd is None and not asked.fresh_launches
           and (executor is Executor.RAY or rounds == 1))
    # Relative by default where it applies: a bad end that only drifts is bisected on drift
    # against the two ends (docs/bisect.md, "Drift and WARN").
    drift = DriftRule(asked.drift or cfg.drift
                      or (DriftRule.RELATIVE if hot else DriftRule.ABSOLUTE))
    if drift is DriftRule.RELATIVE and not hot:
        raise BisectError("--drift relative judges the sequential trial probe of a hot "
                          "bisect", "drop --fresh-launches, --parallel K > 1 (local) and "
                          "--test-cmd, or use --drift absolute")
    # The ends in two looks where trials are hot and sequential (`TrialPolicy.end_looks`,
    # bisect/end_looks.py) unless full ends are asked for, locally and on Ray alike (the nodes
    # share each look's ends and the look that settled a block: docs/cluster.md, "The ends
    # travel").
    full_ends = bool(asked.full_ends if asked.full_ends is not None else cfg.full_ends)
    return TrialPolicy(warn_as=WarnAs(asked.warn_as or cfg.warn_as), drift=drift, hot=hot,
                       sequential=hot, shard=hot and asked.shard and executor is Executor.RAY,
                       executor=executor, full_ends=full_ends)


def _node_slots(nodes: int | None, parallel: int, policy: TrialPolicy) -> int | None:
    """`--nodes`: the Ray executor's slots, at least the round's trials (`--parallel`)."""
    if nodes is None:
        return None
    if policy.executor is not Executor.RAY:
        raise ConfigError("--nodes is the Ray executor's", "add --executor ray, or drop --nodes")
    if nodes < parallel:
        raise ConfigError(f"--nodes {nodes} is fewer than --parallel {parallel} trials a round",
                          f"use --nodes {parallel} or more (the extra nodes shard probes)")
    return nodes


def bad_end(q: Question) -> dict[str, str]:
    """The patch set of the full candidate set (the bad end as the search names it)."""
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)
    return spec.patches_for(frozenset(q.candidates))


def run_bad_end(q: Question) -> dict[str, str]:
    """The bad end as `run` of the profile measures it: `bad_end` with the patches the question
    left out as inert at their bad-end state (the bisect holds them at the good end's: they
    change nothing here), whose cached candidate is then the bisect's bad end (docs/bisect.md,
    "The ends a failing run already measured")."""
    out = bad_end(q)
    for name, why in q.left_out:
        if not why.startswith("inert"):
            continue  # held at the good end's state on purpose: another configuration
        if name in q.bad:
            out[name] = q.bad[name]
        else:
            out.pop(name, None)
    return out


def tier_priors(q: Question) -> dict[str, float]:
    """Prior weights by patch tier and setting tier, with the profile's `bisect.priors` over
    them."""
    weights = tier_weights(q.tiers)
    weights.update(q.setting_weights)  # settings: by switch tier (bisect/switch_info.py)
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


def _good_cached(runner: EngineRunner | None, looks: bool) -> str | None:
    """When the cached baseline pair that seed block 0's good end will be read from was made
    (its look 1's own entry, or the full tier's, which a look restricts: EndProbes.good_end);
    None: the good end is probed."""
    if runner is None:
        return None
    full = runner.spec.replace(seed_block=0)
    for spec in ([look_spec(full, 1), full] if looks else [full]):
        hit, _ = baseline_cache.lookup(baseline_cache.BaselineKey.of(
            runner.good_cfg.fingerprint, spec))
        if hit is not None:
            return hit.created_at
    return None


def _costs(runner: EngineRunner | None, q: Question, noise: Noise,
           details: list[dict[str, Any]], durations: list[float],
           given: dict[str, float | None], hot: bool, looks: bool,
           ends_cached: str | None = None, good_cached: str | None = None) -> PlanCosts:
    """Every cost the plan and the priced design use, each with its source (plan/costs.py):
    given; else measured in the ledger for this probe; else assumed per engine kind and tier."""
    if runner is None:  # a test command: nothing to assume about an engine
        return plan_costs(None, None, given=given, durations=durations)
    engine = "reference" if runner.good_cfg.kind == "reference" else "sglang"
    trial = Noise(*TRIAL_ERROR_RATES)  # what the hot runner asks of its sequential trials
    # where the policy has the ends in two looks (hot sequential trials, not `full_ends`:
    # `TrialPolicy.end_looks`), the trials replay look 1's cases where it settled
    # (bisect/end_looks.py); elsewhere the ends are probed at the full tier
    look = look_spec(runner.spec, 1) if looks else None
    return plan_costs(engine, probe_shape(runner.spec), given=given, details=details,
                      load_time=tuple(q.load_time), hot=hot, noise=noise,
                      sequential=sequential_from_probe(look or runner.spec, trial) if hot
                      else None, look1=probe_shape(look) if look else None,
                      ends_cached=ends_cached, good_cached=good_cached)
