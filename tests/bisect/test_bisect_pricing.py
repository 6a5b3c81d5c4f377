"""The priced search: per-record error rates, BETWEEN, what a step costs given what ran before
it, information per second, and the whole-bisect plan with and without each lever."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from dsv4bisect.bisect.plan.costs import SGLANG_PROBE_S_PER_TOKEN, plan_costs, probe_shape
from dsv4bisect.bisect.plan.simulate import oracle_outcome
from dsv4bisect.bisect.plan.whole_plan import Setup, plan_bisect
from dsv4bisect.bisect.search.design import Noise, RoundDesign
from dsv4bisect.bisect.search.hypotheses import tier_weights
from dsv4bisect.bisect.search.pricing import CostTracker, EngineSlots, StepCosts
from dsv4bisect.bisect.search.search import Search, Status
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.errors import BisectError
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.spec import tier_spec

NAMES = ("a", "b", "c", "d", "e", "f")
FIVE = Noise(0.05, 0.05)
EXACT = Noise(0.0, 0.0)
SGLANG = StepCosts(launch_s=600, switch_s=90, probe_s=1200, aa_fraction=1.0, sequential=True,
                   like_good_fraction=0.25, like_bad_fraction=0.10, hot=True, pool=1,
                   load_time=frozenset({"a", "b", "c"}), paired=True)


def ended(search: Search) -> Search:
    search.record(frozenset(), V.PASS)
    search.record(frozenset(search.candidates), V.FAIL)
    return search


# -- per-record error rates and BETWEEN --------------------------------------------------------
def test_a_record_counts_at_the_rates_its_own_verdict_holds():
    sure, loose = ended(Search(NAMES, noise=FIVE)), ended(Search(NAMES, noise=FIVE))
    sure.record({"a", "b", "c"}, V.FAIL, noise=Noise(0.001, 0.001))
    loose.record({"a", "b", "c"}, V.FAIL, noise=Noise(0.3, 0.3))
    inside = lambda s: sum(s.marginals()[x] for x in "abc")
    assert inside(sure) > inside(loose) > inside(ended(Search(NAMES, noise=FIVE)))
    # the checks weigh each trial at its own rates too: C = {a} alone failing, sure vs loose
    from dsv4bisect.bisect.search import confirm
    from dsv4bisect.bisect.search.hypotheses import Hypothesis

    def sufficiency(rates: Noise) -> float:
        s = ended(Search(NAMES, noise=FIVE))
        s.record({"a"}, V.FAIL, noise=rates)
        ev = confirm.Evidence(s.records, confirm.loglik(FIVE), 0.95, 0, True, NAMES, 2)
        (check,) = [c for c in confirm.checks_for(Hypothesis("set", frozenset("a")), ev)
                    if c.member is None]
        return check.log10_ratio

    assert sufficiency(Noise(0.001, 0.001)) == pytest.approx(np.log10(0.999 / 0.001))
    assert sufficiency(Noise(0.3, 0.3)) == pytest.approx(np.log10(0.7 / 0.3))


def test_between_is_evidence_for_neither_end_and_may_be_retested():
    search = ended(Search(NAMES, noise=FIVE))
    before = search.posterior()
    subset = frozenset({"a", "b", "c"})
    search.record(subset, V.BETWEEN)
    after = search.posterior()
    sets_and_ends = slice(0, len(before) - 1)
    ratio = after[sets_and_ends] / before[sets_and_ends]
    assert np.allclose(ratio, ratio[0])  # the same likelihood under every set and end
    assert after[-1] > before[-1]  # some evidence for `unexplained`
    assert search.result().status is Status.RUNNING
    assert subset not in {s for s in search._skipped}  # not routed around: it may come back
    for _ in range(3):  # a BETWEEN never confirms anything
        search.record(subset, V.BETWEEN)
    assert all(c.trials == 0 for c in search.result().checks)


def test_a_between_at_an_end_does_not_count_as_checking_it():
    search = Search(NAMES, noise=FIVE)
    search.record(frozenset(), V.BETWEEN)
    assert search.next()[0] == frozenset()  # the good end is still to be checked


# -- what a step costs -------------------------------------------------------------------------
def test_hot_trials_switch_inside_the_engine_of_their_load_time_state():
    t = CostTracker(SGLANG, frozenset(NAMES))
    assert t.charge(frozenset(), False) == 600 + 1200 * 2  # launch, baseline + A/A
    assert t.charge(frozenset({"d", "e"}), True) == 90 + 120  # hot, sequential like bad
    assert t.charge(frozenset({"a", "d"}), False) == 600 + 300  # another load-time state
    assert t.engines == [frozenset({"a"})]  # one engine on SGLang: the oldest was stopped
    assert t.charge(frozenset({"d"}), False) == 600 + 300
    assert t.charge(frozenset(NAMES), True) == 600 + 1200  # the bad end: full size
    assert t.charge(frozenset({"d", "e"}), True) == 600 + 120  # re-test: no new baseline
    assert t.launches == 5


def test_a_pool_of_two_keeps_both_engines_and_fresh_mode_launches_every_trial():
    two = CostTracker(replace(SGLANG, pool=2), frozenset(NAMES))
    for subset in (frozenset(), frozenset({"a"}), frozenset({"d"}), frozenset({"a", "e"})):
        two.charge(subset, False)
    assert two.launches == 2
    fresh = CostTracker(replace(SGLANG, hot=False, sequential=False), frozenset(NAMES))
    assert fresh.charge(frozenset(), False) == 600 + 2400
    assert fresh.charge(frozenset({"d"}), False) == 600 + 1200
    # a full-size re-test is judged against the good end's baseline of its own seed block
    assert fresh.charge(frozenset({"d"}), False) == (600 + 2400) + (600 + 1200)
    assert fresh.launches == 4


def test_the_pool_stops_the_least_recently_used_engine_as_the_hot_runner_does():
    # EngineSlots is the hot runner's pool policy too (trials/engine_pool.py): a switch into
    # an engine refreshes it, so the launch of {b} stops {a}'s engine, not the older ∅'s
    two = CostTracker(replace(SGLANG, pool=2, paired=False, sequential=False), frozenset(NAMES))
    for subset in (frozenset(), frozenset({"a"}), frozenset({"d"}), frozenset({"b"})):
        two.charge(subset, False)
    assert two.engines == [frozenset(), frozenset({"b"})] and two.launches == 3
    slots = EngineSlots(2, ["x", "y"])
    assert slots.use("x") and not slots.use("z") and slots.make_room() == ["y"]
    assert slots.up == ["x"] and slots.make_room() == []


def test_a_round_of_several_trials_is_priced_on_the_nodes_engines():
    """Four nodes, a trial each a round (the Ray executor): a trial takes a free node whose
    engine holds its load-time state (a switch), else the free node used longest ago (a
    launch), as RayRunner places it. One node's price runs the same round in its one engine."""
    costs = replace(SGLANG, paired=False, sequential=False)  # every probe 1200 s
    four, one = CostTracker(costs, frozenset(NAMES), nodes=4), CostTracker(costs, frozenset(NAMES))
    for t in (four, one):
        t.charge(frozenset(), False)  # the ends, a launch each
        t.charge(frozenset(NAMES), True)
        t.new_round()
    abc = frozenset("abc")  # the bad end's load-time state
    assert four.engines == [frozenset(), abc] and four.launches == 2
    assert four.charge(abc | {"d"}, False) == 90 + 1200  # the bad end's node
    assert four.quote(frozenset({"d"}), 0.0) == 90 + 1200  # the good end's node is free
    assert one.charge(abc | {"d"}, False) == 90 + 1200
    assert one.quote(frozenset({"d"}), 0.0) == 600 + 1200  # one engine, in `abc` now
    assert four.charge(frozenset({"d"}), False) == 90 + 1200
    assert four.charge(frozenset({"e"}), False) == 600 + 1200  # ∅'s node is taken this round
    assert four.charge(abc | {"e"}, False) == 600 + 1200  # so is the bad end's
    assert four.launches == 4  # every node taken: a fifth trial starts the next round
    assert four.charge(frozenset({"f"}), False) == 90 + 1200 and four.launches == 4


def test_the_ends_hold_the_nodes_the_executor_lays_them_out_on():
    """Sharded ends (bisect/rounds.py): together, the good end on half the nodes and the bad
    end on the other half; alone, each on every node; unsharded, each on a node of its own.
    So after the ends together a round of four trials switches on all four nodes; priced as if
    each end held one node, two of them launched. With no load-time candidate both ends leave
    ∅ up, on two nodes, not one."""
    costs = replace(SGLANG, paired=False, sequential=False)  # every probe 1200 s
    abc, switch, launch = frozenset("abc"), 90 + 1200, 600 + 1200

    def after_ends(end_nodes: int, costs: StepCosts = costs, nodes: int = 4) -> CostTracker:
        tracker = CostTracker(costs, frozenset(NAMES), nodes=nodes, end_nodes=end_nodes)
        for end in (frozenset(), frozenset(NAMES)):
            tracker.charge(end, bool(end))
            tracker.new_round()
        return tracker

    together = after_ends(2)
    four = (frozenset({"d"}), frozenset({"e"}), abc | {"d"}, abc | {"e"})
    assert [together.charge(s, False) for s in four] == [switch] * 4
    alone = after_ends(4)  # every node ran ∅, then the bad end
    assert [alone.charge(abc | {x}, False) for x in "def"] == [switch] * 3
    assert alone.charge(frozenset({"d"}), False) == launch
    one_each = after_ends(1)
    assert [one_each.charge(frozenset(x), False) for x in "de"] == [switch, launch]
    flat = after_ends(1, replace(costs, load_time=frozenset()), nodes=2)
    assert [flat.charge(frozenset(x), False) for x in "de"] == [switch, switch]


# a node of the seed's deployment: two of six candidates need a launch, trial probes are short
NODE = StepCosts(launch_s=600, switch_s=90, probe_s=2816, aa_fraction=0.18, sequential=True,
                 like_good_fraction=0.042, like_bad_fraction=0.036, hot=True, pool=1,
                 load_time=frozenset({"a", "b"}), paired=True)


def four_nodes_after(history: str) -> Search:
    """A search of four trials a round on four nodes, the ends run together (each on two
    nodes), then `history`: space-separated subsets, `+` failed, `-` passed."""
    trial = Noise(0.01, 0.01)
    search = ended(Search(NAMES, noise=FIVE, trial_noise=trial, costs=NODE, parallel=4,
                          end_nodes=2, confidence=0.99))
    for word in history.split():
        search.record(frozenset(word[:-1]), V.FAIL if word[-1] == "+" else V.PASS, noise=trial)
    return search


def launches(search: Search, subsets: list[frozenset[str]]) -> list[frozenset[str]]:
    """The subsets of a round that launch an engine, on the search's nodes as they are."""
    tracker, out = search._tracker.copy(), []
    for subset in subsets:
        if not tracker.engine_up(subset):
            out.append(subset)
        tracker.charge(subset, 0.5)
    return out


def test_on_four_nodes_a_round_does_not_wait_for_a_launch_that_switches_match():
    """A round lasts as long as its longest trial, so one launch holds all four nodes up by
    it. Here the greedy round's fourth trial launches (both nodes of the bad end's state are
    taken) for no more information than four switches give in a third of the time."""
    search = four_nodes_after("abc- abde- cdf- ef+")
    greedy, switches = search._round(4, switches_only=False), search._round(4, switches_only=True)
    assert launches(search, greedy.subsets) and switches.bits >= 0.9 * greedy.bits
    proposed = search.next()
    assert proposed == switches.subsets and len(proposed) == 4
    assert launches(search, proposed) == []


def test_a_round_that_must_launch_launches_what_the_answer_needs_together():
    """{a, d} or {b, d}: only an engine with one of a, b (both load-time) tells them apart. A
    launch in a round that already waits for one costs the round what a switch would, so both
    launch in one round, not one a round."""
    search = four_nodes_after("abc- abde+ cdf- ef- abd+ abe- de- cdef-")
    assert {h.members for h, _ in search.top(2)} == {frozenset("ad"), frozenset("bd")}
    proposed = search.next()
    assert {frozenset("ad"), frozenset("bd")} <= set(launches(search, proposed))


def test_the_checks_of_a_lead_take_the_nodes_whose_engines_they_can_switch_into():
    """Four nodes, ∅ up on two and the bad end's state {a, b} on two; the lead {d, e} asks
    three checks: {d, e} alone (∅ only), "{e} passes" ({e} or {a, b, e}) and "{d} passes"
    ({d} or {a, b, d}). Each check took the engine up at the round's start, so all three went
    to ∅, and the third launched on a node of {a, b}, holding the round up by a launch. Placed
    one by one, the check with one configuration first, the third runs in {a, b}: a switch."""
    trial = Noise(0.01, 0.01)
    search = ended(Search(NAMES, noise=FIVE, trial_noise=trial, costs=NODE, parallel=4,
                          end_nodes=2, confidence=0.99))
    for round_ in ("abcf- abcd-", "abce- abdef+", "abcde+ abcdf-", "abcef- abcde+"):
        search.begin_round()  # each round in the bad end's two nodes: ∅'s two stay up
        for word in round_.split():
            search.record(frozenset(word[:-1]), V.FAIL if word[-1] == "+" else V.PASS,
                          noise=trial)
    assert search.top(1)[0][0].members == frozenset("de")
    proposed = search.next()
    assert {frozenset("de"), frozenset("e")} <= set(proposed)
    assert frozenset("abd") in proposed and launches(search, proposed) == []


def test_a_check_whose_engine_this_round_takes_waits_for_the_next_round_not_a_launch():
    """Two nodes, one in {a} and one in {b} after a round of launches; the lead {a, d} asks
    {a, d} alone and "{a} passes", both only in {a}, and "{d} passes" ({b, d} in {b}). The
    second check in {a} would launch on {b}'s node, holding the round up by a launch and
    stopping the engine "{d} passes" switches into; it waits a round instead, when {a}'s node
    is free again (a switch)."""
    trial = Noise(0.01, 0.01)
    search = ended(Search(NAMES, noise=FIVE, trial_noise=trial, costs=NODE, parallel=2,
                          end_nodes=1, confidence=0.99))
    for round_ in ("abc- abef-", "abdf+ abce-", "acd+ bcdf-", "acd+ bcdf-"):
        search.begin_round()
        for word in round_.split():
            search.record(frozenset(word[:-1]), V.FAIL if word[-1] == "+" else V.PASS,
                          noise=trial)
    assert search.top(1)[0][0].members == frozenset("ad")
    search.begin_round()
    assert set(search._tracker.engines) == {frozenset("a"), frozenset("b")}
    proposed = search.next()
    assert proposed == [frozenset("ad"), frozenset("bd")]
    assert launches(search, proposed) == []


def test_a_single_culprit_of_engine_trials_needs_a_fresh_look_at_its_sufficiency():
    """One flipped trial of a candidate alone must not name it where sequential trial probes
    or several nodes bring such trials early (docs/performance.md, issue 42, Parts 7 and 8:
    on one node 6 of 400 simulated bisects of `dsv4-flash-tp8-all` named a wrong single that
    way): the set's sufficiency asks a trial run after it led, as a pair's does. A test
    command's search on one node keeps half the log-odds from any trial."""
    trial = Noise(0.01, 0.01)
    test_cmd = StepCosts(probe_s=60.0)  # what a --test-cmd bisect prices: whole calls
    plain = ended(Search(NAMES, noise=FIVE, trial_noise=trial, costs=test_cmd))
    plain.record(set(NAMES) - {"a"}, V.PASS, noise=trial)
    plain.record({"a"}, V.FAIL, noise=trial)
    assert plain.result().status is Status.FOUND
    for parallel, costs in ((1, SGLANG), (2, None)):
        s = ended(Search(NAMES, noise=FIVE, trial_noise=trial, parallel=parallel, costs=costs))
        s.record(set(NAMES) - {"a"}, V.PASS, noise=trial)  # `a` is needed
        assert s.posterior().max() < 0.95
        s.record({"a"}, V.FAIL, noise=trial)  # the trial that makes {a} lead
        assert s.top(1)[0][0].members == frozenset({"a"}) and s.posterior().max() >= 0.95
        assert s.result().status is not Status.FOUND
        assert frozenset({"a"}) in s.next()  # the fresh look: {a} alone again
        s.record({"a"}, V.FAIL, noise=trial)
        assert s.result().status is Status.FOUND and s.result().culprits == frozenset({"a"})


def test_a_quote_does_not_move_the_state():
    t = CostTracker(SGLANG, frozenset(NAMES))
    assert t.quote(frozenset(), 0.0) == 3000 and t.launches == 0 and not t.engines


def test_costs_round_trip_through_the_spec_and_a_version_1_spec_still_reads():
    spec = BisectSpec(NAMES, {}, {n: "on" for n in NAMES}, trial_noise=Noise(0.02, 0.03),
                      costs=SGLANG, confirm=False, parallel=4, end_nodes=2)
    again = BisectSpec.from_json(spec.to_json())
    assert again == spec and again.search().costs == SGLANG
    assert again.search()._tracker.end_nodes == 2  # a resume prices the ends' nodes the same
    old = {**spec.to_json(), "version": 1}
    for key in ("trial_noise", "costs", "confirm", "end_nodes"):
        old.pop(key)
    v1 = BisectSpec.from_json(old)
    assert v1.costs is None and v1.trial_noise is None and v1.confirm and v1.end_nodes == 1
    with pytest.raises(BisectError, match="an end on 5 of 4 nodes"):
        replace(spec, end_nodes=5)


def test_each_assumed_cost_says_so_and_a_given_or_measured_one_wins():
    # One condition (cold at concurrency 1): the prompt tokens the 1200 s default was set for.
    one = probe_shape(tier_spec("standard").replace(arms=("cold",), concurrency=(1,),
                                                    warmup_requests=0))
    assert one.prompt_tokens == 30_408_704
    assert plan_costs("sglang", one, given={}).costs.probe_s == pytest.approx(1200.0)
    # The tier's two conditions (cold at 1, warm at 16) ask every accuracy case twice, drift once.
    shape = probe_shape(tier_spec("standard"))
    assert shape.prompt_tokens == 60_342_272
    assert 0.15 < shape.aa_share < 0.2  # the repeat subset: drift + the two shortest lengths
    assumed = plan_costs("sglang", shape, given={}, load_time=("a",))
    sources = {line.name: line.source for line in assumed.lines}
    assert sources["launch"].startswith("assumed (dsv4bisect default for SGLang")
    # the tier's polluting phase first: 256 requests at its shortest length, 4096 tokens
    polluting = 256 * 4096 * SGLANG_PROBE_S_PER_TOKEN
    assert assumed.costs.probe_s == pytest.approx(2381.25 + polluting)
    assert assumed.costs.pool == 1
    details = [{"mode": "hot", "switch_s": s, "launch_s": 0} for s in (40, 50, 70)]
    measured = plan_costs("sglang", shape, given={"launch": 480.0}, details=details)
    lines = {line.name: line for line in measured.lines}
    assert lines["hot switch"].value == 50 and "median of 3 trials" in lines["hot switch"].source
    assert lines["launch"].source == "given (--launch-cost)"
    assert probe_shape(tier_spec("smoke")).aa_share < 0.5  # the smoke tier's repeat subset


def test_the_probe_is_priced_by_the_tokens_the_engine_computes():
    # the standard tier's warm arm replays turn by turn: every turn computed once, so the
    # arm costs its whole prompt, as cold does (probe/computed.py; measured on the embedded
    # engine: tests/probe/test_computed_tokens_e2e.py)
    shape = probe_shape(tier_spec("standard"))
    conditions = dict(shape.by_condition)
    assert conditions["warm@16"] == conditions["cold@1"] == 29_933_568
    assert shape.computed == shape.prompt_tokens
    # the smoke tier's hit arm, after its cold request at level 1: one token per send
    smoke = probe_shape(tier_spec("smoke"))
    hits = dict(smoke.by_condition)["hit@1"]
    assert hits == 2 * 24  # needle and vartrack, 4 lengths x 3 depths x 1 turn count
    assert smoke.computed == smoke.prompt_tokens - dict(smoke.by_condition)["cold@1"] * 2 // 3 \
        + hits
    line = {c.name: c for c in plan_costs("sglang", shape, given={}).lines}
    assert "computed prompt tokens at 25.3 k computed tokens/s" in line[
        "full probe (standard tier)"].source
    assert "warm@16 29.9 M" in line["full probe (standard tier)"].source
    # a bisect on SGLang prices its probe at the rate its own trials' rows measured
    details = [{"mode": "hot", "computed_tokens": 2e6, "probe_s": s} for s in (40, 50, 100)]
    measured = plan_costs("sglang", shape, given={}, details=details)
    lines = {c.name: c for c in measured.lines}
    assert lines["probe rate"].value == pytest.approx(2e6 / 50)
    # the polluting phase's conversations too, each one request, every token computed
    assert measured.costs.probe_s == pytest.approx(
        (shape.computed + shape.warmup_tokens) / (2e6 / 50))
    assert "at the measured rate" in lines["full probe (standard tier)"].source


# -- the priced design -------------------------------------------------------------------------
def setup(**kw) -> Setup:
    w = tier_weights({"a": 1, "b": 1, "c": 2, "d": 2, "e": 3, "f": 2})
    return Setup(NAMES, FIVE, FIVE, SGLANG, weights=w, base_weights=w, **kw)


def test_the_priced_design_saves_launches_and_time_at_the_same_correctness():
    plan = plan_bisect(setup(), trials=40, seed=1)
    priced, unpriced = plan.with_levers, plan.each_off["priced"]
    assert priced.mean_launches < unpriced.mean_launches
    assert priced.mean_wall_s < unpriced.mean_wall_s
    assert priced.p_correct >= 0.95 and unpriced.p_correct >= 0.9


def test_a_priced_search_is_deterministic_given_its_records():
    rng = random.Random(5)
    first = Search(NAMES, noise=FIVE, costs=SGLANG)
    culprit = frozenset({"b", "e"})
    history = []
    while (proposals := first.next()) and len(history) < 40:
        history.append(proposals)
        for subset in proposals:
            first.record(subset, oracle_outcome(subset, culprit, FIVE, rng))
    replay = Search(NAMES, noise=FIVE, costs=SGLANG)
    for proposals, record in zip(history, first.records):
        assert replay.next() == proposals
        replay.record(record.subset, record.outcome, record.noise)
    assert replay.next() == first.next()


@pytest.mark.parametrize("parallel", [2, 4])
def test_a_search_of_several_trials_a_round_resumes_to_the_same_proposals(parallel: int):
    """A resume asks for each round and takes its outcomes from the ledger (driver.py), so the
    resumed search meets the nodes' engines as the live one did and proposes what it did; a
    replay of the records alone that marks where each round began (the plan's memo) too."""
    rng = random.Random(7)
    def make() -> Search:
        return Search(NAMES, noise=FIVE, costs=SGLANG, parallel=parallel,
                      end_nodes=parallel // 2)

    live, rounds = make(), []
    while (proposals := live.next()) and len(rounds) < 20:
        rounds.append([(s, oracle_outcome(s, frozenset({"a", "e"}), FIVE, rng))
                       for s in proposals])
        for subset, outcome in rounds[-1]:
            live.record(subset, outcome)
        resumed, replayed = make(), make()
        for done in rounds:
            resumed.next()
            replayed.begin_round()
            for subset, outcome in done:
                resumed.record(subset, outcome)
                replayed.record(subset, outcome)
        assert resumed.next() == replayed.next() == live.next()
    assert len(rounds) > 3


def test_a_round_leaves_the_engines_its_trials_left_on_their_nodes():
    """Four nodes after the ends together (∅ on two, the bad end's load-time state {a, b} on
    two), a round of four trials, three in {a}: each takes a node of its own, as the executor
    places them, so after it no node holds ∅ or {a, b} and a trial in either launches. Freeing
    every node after each record instead had the second and third {a} trials switch on the
    first one's node, and the search went on pricing ∅ and {a, b} as up: the checks of a pair
    with one load-time member were then priced as switches and launched."""
    search = ended(Search(NAMES, noise=FIVE, costs=NODE, parallel=4, end_nodes=2))
    assert set(search._tracker.engines) == {frozenset(), frozenset("ab")}
    search.begin_round()
    for subset in ("ac", "bd", "ae", "af"):
        search.record(frozenset(subset), V.PASS)
    search.begin_round()
    assert set(search._tracker.engines) == {frozenset("a"), frozenset("b")}
    assert not search._tracker.engine_up(frozenset("d"))  # ∅: a launch now


# -- the whole-bisect plan ---------------------------------------------------------------------
def test_the_whole_plan_counts_every_phase_and_each_lever_from_one_simulation():
    plan = plan_bisect(setup(), trials=30, seed=2)
    assert plan == plan_bisect(setup(), trials=30, seed=2)  # deterministic
    assert plan.levers == ("hot", "sequential", "priced")  # no microtest priors given
    f = plan.with_levers
    assert f.mean_wall_s == pytest.approx(sum(f.phase_s.values()))
    assert f.phase_s["ends"] >= 600 + 2400 + 90 + 1200 - 1e-6  # launch, baseline, A/A, bad end
    # one fresh launch per FOUND, unless a search trial launched its engine in the culprits'
    # configuration and failed (test below)
    assert 0 < f.phase_s["confirmation"] <= 600 + 1200 * 0.25
    assert plan.without_levers.phase_s["confirmation"] == 0  # fresh trials need no confirmation
    for lever in plan.levers:
        assert plan.each_off[lever].mean_wall_s > f.mean_wall_s * 0.95
    assert plan.without_levers.mean_wall_s > 2 * f.mean_wall_s
    no_confirm = plan_bisect(setup(confirm=False), trials=30, seed=2).with_levers
    assert no_confirm.phase_s["confirmation"] == 0


def test_a_trial_that_launched_its_own_engine_and_failed_is_the_fresh_confirmation():
    t = CostTracker(SGLANG, frozenset(NAMES))
    t.charge(frozenset(), False)
    assert t.launched_last  # the good end: launched for it
    t.charge(frozenset({"d"}), True)
    assert not t.launched_last  # switched inside the engine of λ = ∅
    t.charge(frozenset({"a", "d"}), True)
    assert t.launched_last  # λ = {a} is not up: launched in {a, d} itself
    # a good end whose block's baseline another trial measured is that baseline: it starts
    # nothing, so it is no fresh launch whatever the trial before it was
    full = CostTracker(replace(SGLANG, sequential=False), frozenset(NAMES))
    for subset in ((), ("d",), ("d",), ("a", "d")):  # the second {d} measures block 1's
        full.charge(frozenset(subset), False)
    assert full.launched_last
    assert full.charge(frozenset(), False) == 0.0 and not full.launched_last
    # every candidate load-time: every trial launches its own engine, so the culprits' failing
    # trial is always a fresh launch and the confirmation costs nothing more
    every = plan_bisect(replace(setup(), costs=replace(SGLANG, load_time=frozenset(NAMES))),
                        trials=20, seed=4, compare=False).with_levers
    assert every.phase_s["confirmation"] == 0 and every.p_correct >= 0.9
    # none load-time: the culprits' trial is always switched, so the confirmation is launched
    none = plan_bisect(replace(setup(), costs=replace(SGLANG, load_time=frozenset())),
                       trials=20, seed=4, compare=False).with_levers
    assert none.phase_s["confirmation"] >= 600 * none.p_correct


def test_the_priors_lever_is_judged_against_culprits_from_a_flat_prior():
    heavy = dict.fromkeys(NAMES, 1.0) | {"a": 50.0}  # a prior that bets everything on `a`
    plan = plan_bisect(replace(setup(), weights=heavy, base_weights=dict.fromkeys(NAMES, 1.0)),
                       trials=30, seed=3)
    assert "priors" in plan.levers
    # drawn from a flat prior, `a` is the culprit in few runs: the bet costs, not saves
    assert plan.saves_s("priors") < 0


def test_the_confirm_phase_switches_before_it_launches_and_launches_what_it_needs_once():
    seen = {"hot": 0, "rest": 0, "own": 0, "remedy state": 0}
    for culprit in ({"d", "e"}, {"e", "f"}, {"a", "d"}, {"d"}, {"b", "c"}, {"a", "b"}):
        search, rng = Search(NAMES, noise=FIVE, costs=SGLANG), random.Random(5)
        while proposals := search.next():
            lead = search._confirming()
            if lead is not None:
                hyp, tracker = search.space.hypothesis(lead), search._tracker
                options = search._check_options(lead)
                rest = frozenset(NAMES) - hyp.members
                first = proposals[0]
                if any(tracker.engine_up(o) for opts in options for o in opts):
                    assert tracker.engine_up(first)  # a switch before any launch
                    seen["hot"] += 1
                elif first == rest and tracker.engine_up(rest):
                    # the remedy's configuration while its engine is up: the driver's remedy
                    # check then reuses this outcome instead of launching it again
                    seen["rest"] += 1
                elif hyp.members in [opts[0] for opts in options]:
                    assert first == hyp.members  # a launch for it is its confirmation
                    seen["own"] += 1
                elif first & SGLANG.load_time == rest & SGLANG.load_time:
                    seen["remedy state"] += 1  # the remedy check then switches, not launches
            for subset in proposals:
                search.record(subset, oracle_outcome(subset, frozenset(culprit), EXACT, rng))
        assert search.result().culprits == frozenset(culprit)  # the search still assumes 5 %
    assert all(seen.values()), seen


def test_a_launch_of_the_likely_culprits_is_credited_as_the_fresh_confirmation():
    def credit(confirm: bool, subset: frozenset[str]) -> float:
        search = ended(Search(NAMES, noise=FIVE, costs=SGLANG, confirm=confirm))
        for _ in range(2):  # {a} becomes the likely culprit set; the engine up is λ = {b, c}
            search.record(frozenset({"a", "b", "c"}), V.FAIL)
            search.record(frozenset({"b", "c", "d", "e", "f"}), V.PASS)
        tracker = search._tracker.copy()
        design = RoundDesign(search.space, search.posterior(), search.trial_noise)
        price = search._pricer(design, tracker)
        assert price is not None and not tracker.engine_up(subset)
        return price(search.space.mask(subset))[1]

    a, ab = frozenset({"a"}), frozenset({"a", "d"})
    assert 0.5 < credit(True, a) <= 0.9  # its launch is likely the confirmation
    assert credit(False, a) == 0.0  # --no-confirm, or an executor that cannot launch fresh
    assert credit(True, ab) < 0.1  # an unlikely set
