"""Where each cost of the plan comes from: given, measured in the ledger, or assumed (and by
whom). Pure: the caller reads the ledger and the probe; docs/bisect.md, "The costs and their
sources", lists every assumption and why.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dsv4bisect.bisect.end_looks import LOOK1_ALPHA_OVERALL, LOOK1_MAX_SHARE, LOOK2_RISK
from dsv4bisect.bisect.plan.look_world import LookOne, look_cells
from dsv4bisect.bisect.search.design import DEFAULT_NOISE, Noise
from dsv4bisect.bisect.search.pricing import StepCosts
from dsv4bisect.probe.grid import answer_conditions
from dsv4bisect.probe.stats import wilson

MIN_MEASURED = 3  # finished trials with a figure before the plan trusts their median

# The standard tier's cold arm, 30.4 M prompt tokens all computed, in 1200 s (the dsv4bisect
# default since the first plan): 25.3 k computed prompt tokens/s on one 8-GPU node. A request
# costs the prompt tokens the prefix cache leaves to compute (probe/computed.py; prefill-bound:
# answers are at most a few hundred tokens).
SGLANG_PROBE_S_PER_TOKEN = 1200.0 / 30_408_704
SGLANG_LAUNCH_S = 600.0
# drain (~0 s: no request is in flight between trials) + the switch at a barrier on every rank
# (~1 s) + re-capturing the decode CUDA graphs, whose kernels changed (~60 s, the capture share
# of a launch) + flushing the prefix cache (~1 s) + first-call JIT of a kernel the switch
# selects (TileLang/Triton, up to ~30 s; cached after the first time).
SGLANG_SWITCH_S = 90.0
REFERENCE_LAUNCH_S = 10.0
REFERENCE_SWITCH_S = 1.0  # in-process, eager on CPU: no graphs to capture
# Seconds of a full probe per tier: the embedded engine's, and the least any engine takes (the
# tier's requests decode and are scheduled whatever their prompt length).
TIER_PROBE_S = {"ci": 20.0, "smoke": 60.0, "standard": 1200.0, "deep": 3600.0}
# One polluting request on the embedded engine (probe/warmup.py: a conversation at the tier's
# shortest length, its short answer): 0.8-1.6 s measured at load ~10 on the shared 2-core CPU,
# 16 in flight (tests/benchmarks/pd_transfer.py --warmup; docs/performance.md, "PD
# disaggregation")
REFERENCE_WARMUP_S_PER_REQUEST = 1.0
TEST_CMD_S = 60.0
# The sequential trial probe's expected share of the full probe until it states its own
# (`probe.sequential.plan_trial`): like a bad end losing 30 % of answers at most a tenth (the
# issue's bound for it); like the good end 0.25 (accepting "like good" needs more requests than
# rejecting it: a per-request likelihood ratio of about half the size, and the long cells first).
LIKE_BAD_FRACTION = 0.10
LIKE_GOOD_FRACTION = 0.25
POOL = {"sglang": 1, "reference": 2}  # engines kept up at once: one node; two on the CPU


@dataclass(frozen=True)
class CostLine:
    name: str
    value: float
    unit: str  # "s", "share", "engines" or "tokens/s"
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "unit": self.unit,
                "source": self.source}


@dataclass(frozen=True)
class PlanCosts:
    costs: StepCosts
    trial_noise: Noise
    lines: tuple[CostLine, ...]
    look1: LookOne | None = None  # the simulated world's bad end at look 1 (two looks only)


@dataclass(frozen=True)
class ProbeShape:
    """What the costs need of the probe: its tier, prompt tokens of the full probe, the A/A
    repeat's share of them."""

    tier: str
    prompt_tokens: int
    aa_share: float
    aa_note: str
    drift_share: float = 0.0  # the drift transcripts' share of the computed tokens
    # what a prefix cache leaves SGLang to compute (probe/computed.py); 0: taken as
    # `prompt_tokens`
    computed_tokens: int = 0
    by_condition: tuple[tuple[str, int], ...] = ()  # ("cold@1", computed tokens), "drift"
    warmup_requests: int = 0  # the polluting phase before every probe of a server
    warmup_tokens: int = 0  # its prompt tokens (not in prompt_tokens), every one computed
    accuracy_requests: int = 0  # paired accuracy answers (every condition; drift not)
    case_share: float = 1.0  # the look it prices (spec.case_share)

    @property
    def computed(self) -> int:
        return self.computed_tokens or self.prompt_tokens


@dataclass(frozen=True)
class Sequential:
    """What the sequential trial probe states (plan_trial), or None where it is not here."""

    like_good_fraction: float
    like_bad_fraction: float
    noise: Noise
    source: str


def plan_costs(
    engine: str | None,
    shape: ProbeShape | None,
    *,
    given: Mapping[str, float | None],
    details: Sequence[Mapping[str, Any]] = (),
    durations: Sequence[float] = (),
    load_time: Sequence[str] = (),
    hot: bool = True,
    noise: Noise = DEFAULT_NOISE,
    sequential: Sequential | None = None,
    look1: ProbeShape | None = None,
    ends_cached: str | None = None,
    good_cached: str | None = None,
) -> PlanCosts:
    """The step costs of a bisect. `engine`: "sglang", "reference", or None for a --test-cmd;
    `given`: --launch-cost / --switch-cost / --probe-cost (None: not given); `details` and
    `durations`: this probe's finished trials in the ledger. `look1`: the ends' look-1 probe
    (`probe_shape(look_spec(spec, 1))`, bisect/end_looks.py) where the ends are probed in two looks; None, or a look
    that keeps every case, prices full-tier ends. `ends_cached`: when the `run` that cached
    seed block 0's ends (the good end's pair and its candidate, the bad end) made them, where
    the bisect will use them (the caller looks; None: not cached, or `--no-cache`).
    `good_cached`: when the cached baseline pair seed block 0's good end will be read from was
    made, where the run's ends are not both cached (None: the good end is probed)."""
    if engine is None:
        return _test_cmd_costs(given, durations)
    lines: list[CostLine] = []
    kind = "SGLang" if engine != "reference" else "the embedded engine"
    launch_default = SGLANG_LAUNCH_S if engine != "reference" else REFERENCE_LAUNCH_S
    switch_default = SGLANG_SWITCH_S if engine != "reference" else REFERENCE_SWITCH_S
    assert shape is not None
    floor = TIER_PROBE_S.get(shape.tier, 600.0)
    rate = _measured_rate(details) if engine != "reference" else None
    if rate is not None:
        lines.append(CostLine("probe rate", rate[0], "tokens/s",
                              f"measured: median of {rate[1]} trials in the ledger, the "
                              "computed prompt tokens of their rows over their probe seconds"))
    per_token = 1 / rate[0] if rate is not None else SGLANG_PROBE_S_PER_TOKEN
    rate_why = ("at the measured rate" if rate is not None else
                f"at {1 / SGLANG_PROBE_S_PER_TOKEN / 1e3:.1f} k computed tokens/s")
    computed = _computed_note(shape)
    if engine == "reference":
        probe_default = floor
        probe_why = f"dsv4bisect default for the {shape.tier} tier on {kind}"
    elif shape.computed * per_token >= floor:
        probe_default = shape.computed * per_token
        probe_why = (f"dsv4bisect default for SGLang: {shape.computed / 1e6:.1f} M computed "
                     f"prompt tokens {rate_why}; {computed}")
    else:  # a small tier: per-request overheads (decode, scheduling) dominate its prefill
        probe_default = floor
        probe_why = (f"dsv4bisect default for the {shape.tier} tier on SGLang: "
                     f"{shape.computed / 1e3:.0f} k computed prompt tokens take "
                     f"{shape.computed * per_token:.0f} s of prefill; the "
                     "tier's fixed minimum counts its requests' decode and scheduling")
    if shape.warmup_requests:  # every probe of a server pays its polluting phase first
        warm_s = (shape.warmup_requests * REFERENCE_WARMUP_S_PER_REQUEST if engine == "reference"
                  else shape.warmup_tokens * per_token)
        probe_default += warm_s
        probe_why += (f"; with the polluting phase of {shape.warmup_requests} requests "
                      f"({shape.warmup_tokens / 1e3:.0f} k prompt tokens, all computed, "
                      f"~{warm_s:.0f} s) before the measured ones")
    launch = _pick("launch", given.get("launch"), _measured(details, "launch_s"),
                   launch_default, f"dsv4bisect default for {kind}", lines)
    switch = _pick("hot switch", given.get("switch"), _measured(details, "switch_s", "hot"),
                   switch_default, f"dsv4bisect default for {kind}: drain, switch at a barrier, "
                   "CUDA-graph re-capture, prefix-cache flush, first-call JIT"
                   if engine != "reference" else f"dsv4bisect default for {kind}", lines)
    probe = _pick(f"full probe ({shape.tier} tier)", given.get("probe"),
                  _measured(details, "probe_s", "fresh"), probe_default, probe_why, lines)
    lines.append(CostLine("A/A repeat", shape.aa_share, "share", shape.aa_note))
    lines.append(CostLine("drift scoring", shape.drift_share, "share",
                          "the drift cases' share of the probe's computed tokens: the part of a "
                          "candidate's probe that needs the good end's run (probe/ahead.py)"))
    if sequential is None:
        seq = Sequential(LIKE_GOOD_FRACTION, LIKE_BAD_FRACTION, noise,
                         "assumed (dsv4bisect default until the sequential trial probe states "
                         "it)")
    else:
        seq = sequential
    world, looks = _looks(shape, look1, lines)
    share = looks.get("look1_fraction", 1.0)
    if sequential is not None and share < 1:  # stated on look 1's grid: a share of its probe
        seq = replace(seq, like_good_fraction=seq.like_good_fraction * share,
                      like_bad_fraction=seq.like_bad_fraction * share,
                      source=f"{seq.source}; times {share:.3f}, look 1's share of the full probe")
    lines.append(CostLine("trial probe, like the good end", seq.like_good_fraction, "share",
                          seq.source))
    lines.append(CostLine("trial probe, like the bad end", seq.like_bad_fraction, "share",
                          seq.source))
    if ends_cached is not None:
        lines.append(CostLine("ends of seed block 0", 0.0, "s",
                              f"cached by a run at {ends_cached}: its baseline, A/A repeat and "
                              "candidate are the block's full-tier ends, no request sent "
                              "(bisect/trials/end_probes.py)"))
    elif good_cached is not None:
        lines.append(CostLine("good end of seed block 0", 0.0, "s",
                              f"its baseline and A/A repeat cached at {good_cached}: read from "
                              "the cache (bisect/trials/end_probes.py `good_end`); its end "
                              "check still launches its engine and probes it once against "
                              "them, so only the A/A repeat is saved"))
    pool = POOL.get(engine, 1)
    lines.append(CostLine("engines kept up", pool, "engines",
                          f"dsv4bisect policy for {kind}" + (": one node" if pool == 1 else "")))
    costs = StepCosts(launch_s=launch, switch_s=switch, probe_s=probe,
                      aa_fraction=shape.aa_share, sequential=hot,
                      like_good_fraction=seq.like_good_fraction,
                      like_bad_fraction=seq.like_bad_fraction, hot=hot, pool=pool,
                      load_time=frozenset(load_time), paired=True,
                      drift_fraction=shape.drift_share, ends0_cached=ends_cached is not None,
                      good0_cached=good_cached is not None, **looks)
    return PlanCosts(costs, seq.noise if hot else noise, tuple(lines), world)


def _looks(full: ProbeShape, look: ProbeShape | None, lines: list[CostLine]
           ) -> tuple[LookOne | None, dict[str, float]]:
    """The ends' look 1 as shares of the full probe, and the world its draws come from; none
    where it keeps every case (the full tier is then look 1, the only look). The polluting
    phase and every drift transcript are whole in look 1; the shares are of computed tokens,
    the polluting phase's included (what `plan_costs` prices a full probe by)."""
    if look is None or look.computed >= full.computed:
        return None, {}
    whole = full.computed + full.warmup_tokens
    fraction = (look.computed + look.warmup_tokens) / whole
    world = LookOne(look.accuracy_requests)
    chance = world.look2_chance
    lines.append(CostLine(
        "ends, look 1", fraction, "share",
        f"dsv4bisect design (bisect/end_looks.py): each seed block's ends first at "
        f"{look.case_share:g} of each (family, length) stratum's accuracy cases (the smallest "
        f"share whose paired answers settle the verdict table's smallest loss with P(look 2) "
        f"<= {LOOK2_RISK:g}, at most {LOOK1_MAX_SHARE:g}), every drift transcript and the "
        f"polluting phase: {look.computed / 1e6:.1f} M of {full.computed / 1e6:.1f} M computed "
        "prompt tokens"))
    lines.append(CostLine("ends, look 1, A/A repeat", look.aa_share * fraction, "share",
                          f"{look.aa_share:.2f} of look 1's probe: {look.aa_note}"))
    lines.append(CostLine(
        "ends, look 2", chance, "share",
        f"simulated world: P(the bad end's look 1 does not settle) on its "
        f"{look.accuracy_requests} paired answers, the good end right on "
        f"{world.good_accuracy:.0%}, the bad end losing {world.loss_rate:.0%} of them (the "
        f"verdict table's smallest loss), settled at exact McNemar p <= {LOOK1_ALPHA_OVERALL:g}; "
        "then both ends on the rest of the full tier (the plan draws it per block)"))
    rest = (full.computed - look.computed + full.warmup_tokens) / whole
    lines.append(CostLine(
        "ends, look 2, each end", rest, "share",
        f"the cases look 1 did not keep and the polluting phase again: "
        f"{(full.computed - look.computed) / 1e6:.1f} M computed prompt tokens; look 1's "
        "requests are not sent again (probe/looks.py)"))
    return world, {"look1_fraction": fraction, "look1_aa_fraction": look.aa_share * fraction,
                   "look2_chance": chance, "look2_fraction": rest}


def _test_cmd_costs(given: Mapping[str, float | None],
                    durations: Sequence[float]) -> PlanCosts:
    lines: list[CostLine] = []
    launch = given.get("launch")
    if launch is None:
        launch = 0.0
        lines.append(CostLine("launch", 0.0, "s", "none: a test command"))
    else:
        lines.append(CostLine("launch", launch, "s", "given (--launch-cost)"))
    measured = _median(durations)
    probe = _pick("test command", given.get("probe"), measured, TEST_CMD_S,
                  "dsv4bisect default for a --test-cmd", lines)
    return PlanCosts(StepCosts(launch_s=launch, probe_s=probe), Noise(), tuple(lines))


def _pick(name: str, given: float | None, measured: tuple[float, int] | None, default: float,
          why: str, lines: list[CostLine]) -> float:
    if given is not None:
        option = {"launch": "--launch-cost", "hot switch": "--switch-cost"}.get(
            name, "--probe-cost")
        lines.append(CostLine(name, given, "s", f"given ({option})"))
        return given
    if measured is not None:
        value, n = measured
        lines.append(CostLine(name, value, "s", f"measured: median of {n} trials in the ledger"))
        return value
    lines.append(CostLine(name, default, "s", f"assumed ({why})"))
    return default


def _measured(details: Sequence[Mapping[str, Any]], key: str,
              mode: str | None = None) -> tuple[float, int] | None:
    """The median of `key` over the trials that report it (> 0), in `mode` where given."""
    values = []
    for d in details:
        value = d.get(key)
        if (mode is None or d.get("mode") == mode) and isinstance(value, (int, float)) \
                and value > 0:
            values.append(float(value))
    return _median(values)


def _measured_rate(details: Sequence[Mapping[str, Any]]) -> tuple[float, int] | None:
    """Computed prompt tokens per probe second, the median over the trials that report both
    (the rows of their probes: `probe.computed.run_computed`)."""
    rates = []
    for d in details:
        tokens, seconds = d.get("computed_tokens"), d.get("probe_s")
        if isinstance(tokens, (int, float)) and isinstance(seconds, (int, float)) \
                and tokens > 0 and seconds > 0:
            rates.append(tokens / seconds)
    return _median(rates)


def _computed_note(shape: ProbeShape) -> str:
    """Where the computed tokens come from, per condition (the source line of the probe)."""
    if not shape.by_condition:
        return "every prompt token computed"
    parts = ", ".join(f"{key} {tokens / 1e6:.1f} M" for key, tokens in shape.by_condition)
    return (f"{parts} of {shape.prompt_tokens / 1e6:.1f} M nominal; cold = every prompt "
            "token, warm = every turn once (the replay computes each new turn), hit = the "
            "token SGLang recomputes per send; measured on the embedded engine "
            "(prefill_tokens_computed, rows' cached_tokens: probe/computed.py)")


def _median(values: Sequence[float]) -> tuple[float, int] | None:
    if len(values) < MIN_MEASURED:
        return None
    return float(statistics.median(values)), len(values)


def probe_shape(spec: Any) -> ProbeShape:
    """The tokens of a probe spec's probe (the whole tier, or the look `spec.case_share` keeps:
    look_world.look_cells): nominal prompt tokens (lengths × cases, per condition: arm ×
    concurrency level; drift once) and what a prefix cache leaves SGLang to compute of them
    (probe/computed.py, per arm and level), and the A/A repeat's and the drift cases' shares of
    the computed tokens (run/baseline.py: the tier's repeat subset)."""
    from dsv4bisect.probe.computed import request_computed
    from dsv4bisect.run.baseline import REPEAT_SHORTEST_LENGTHS

    grid = look_cells(spec)  # the cases of the look `spec.case_share`: the tier's at 1
    by_condition: dict[str, int] = {}
    nominal = computed = drift = repeated = answers = 0
    keep = REPEAT_SHORTEST_LENGTHS.get(spec.tier)
    lengths = sorted({cell.length for cell, _ in grid if cell.family != "drift"})
    whole = keep is None or len(lengths) <= keep
    short = set(lengths if whole else lengths[:keep])
    for cell, n in grid:
        if cell.family == "drift":  # scored once, every token
            asked = [("drift", 0, cell.length)]
        else:
            asked = [(arm, level, request_computed(arm, cell.length,
                                                   after_cold="cold" in spec.arms_at(level)))
                     for arm, level in answer_conditions(spec, cell.family)]
        for arm, level, tokens in asked:
            key = "drift" if arm == "drift" else f"{arm}@{level}"
            by_condition[key] = by_condition.get(key, 0) + tokens * n
            nominal += cell.length * n
            computed += tokens * n
            drift += tokens * n if arm == "drift" else 0
            repeated += tokens * n if arm == "drift" or cell.length in short else 0
            answers += n if arm != "drift" else 0
    total = max(computed, 1)
    note = (f"the {spec.tier} tier repeats the whole probe (run/baseline.py)" if whole else
            f"the {spec.tier} tier repeats the drift cases and the lengths {sorted(short)} "
            "(run/baseline.py), by computed tokens")
    # the polluting phase (probe/warmup.py) at the shortest length, priced apart (plan_costs):
    # each conversation one request, nothing of it cached
    return ProbeShape(spec.tier, nominal, 1.0 if whole else repeated / total, note,
                      drift / total, computed, tuple(sorted(by_condition.items())),
                      spec.warmup_requests, spec.warmup_requests * min(spec.lengths), answers,
                      spec.case_share)


def sequential_from_probe(spec: Any, noise: Noise) -> Sequential | None:
    """What the sequential trial probe states for this spec, when it is installed here."""
    from dsv4bisect.bisect.plan.trial_plan_cache import planned_trial

    stated: Any = planned_trial(spec, noise.false_fail, noise.false_pass)
    sims = int(stated.sims)
    look = (f", on the cases of the ends' look 1 ({spec.case_share:g} of each stratum: "
            "look_world.py)" if spec.case_share < 1 else "")
    # the simulated bisect flips a trial at the rates the probe asks for, or at those its own
    # simulation shows where they are higher
    false_fail = max(stated.false_fail, stated.wrong_good)
    false_pass = max(stated.false_pass, stated.wrong_bad)
    bounds = [wilson(round(wrong * sims), sims)[1] for wrong in (stated.wrong_good,
                                                                stated.wrong_bad)]
    return Sequential(
        like_good_fraction=float(stated.cost_fraction_good),
        like_bad_fraction=float(stated.cost_fraction_bad),
        noise=Noise(false_fail, false_pass),
        source=(f"simulated by the sequential trial probe (probe/sequential_plan.py"
                f"{look}, {sims} trials each way: a good end right 90 % of the time, a bad end "
                f"losing {stated.loss_rate:.0%} of its right answers, the verdict table's "
                f"smallest loss; {stated.mean_requests_good:.0f} / "
                f"{stated.mean_requests_bad:.0f} of {stated.full_requests} requests; decided "
                f"wrong {stated.wrong_good:.1%} / {stated.wrong_bad:.1%}, at most "
                f"{bounds[0]:.1%} / {bounds[1]:.1%} (Wilson, 95 %); priced at the asked rates "
                "or these, the higher)"))
