"""Trials beside the ends (bisect/rounds.py BESIDE; docs/cluster.md, "Trials beside the ends"):
each end on one node, and the first round's other nodes running the search's first trials,
started with the ends and judged against the good end's run; the round the driver and the plan
run, the search that fills it, what the plan charges for it, the rates its trials hold to, and
the remedy check's place among a round of checks once every state has a node."""

from __future__ import annotations

import random

from dsv4bisect.bisect.driver import _Decision, _Slot, beside_rates, start_bisect
from dsv4bisect.bisect.end_looks import LOOK2_RISK
from dsv4bisect.bisect.ledger import Ledger
from dsv4bisect.bisect.plan.simulate import NodePool, Setup, common_draws, search_memo, simulate
from dsv4bisect.bisect.rounds import BESIDE, TOGETHER, end_nodes, ends_round, schedules
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.pricing import StepCosts
from dsv4bisect.bisect.search.search import Search
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.probing import Probe, ProbingPolicy
from dsv4bisect.bisect.trials.runner import TrialResult
from dsv4bisect.policy import TrialPolicy
from dsv4bisect.probe import verdict as V
from tests.bisect.test_bisect_driver import NAMES as DRIVER_NAMES
from tests.bisect.test_bisect_driver import EndsAloneRunner, spec
from tests.bisect.test_bisect_pricing import launches

NAMES = ("a", "b", "c", "d", "e", "f")
EVERYTHING = frozenset(NAMES)
FIVE, TRIAL = Noise(0.05, 0.05), Noise(0.01, 0.01)
# a node of the seed's deployment, the ends in two looks: a and b load at launch
NODE = StepCosts(launch_s=600, switch_s=90, probe_s=2816, aa_fraction=0.18, sequential=True,
                 like_good_fraction=0.042, like_bad_fraction=0.036, hot=True, pool=1,
                 load_time=frozenset({"a", "b"}), paired=True, look1_fraction=0.09,
                 look1_aa_fraction=0.016, look2_chance=1e-4, look2_fraction=0.91,
                 drift_fraction=0.05)


def test_the_round_holds_both_ends_then_the_trials_beside_them():
    x, y = frozenset("ac"), frozenset("bd")
    proposals = [frozenset(), EVERYTHING, x, y, x]
    assert ends_round(proposals, EVERYTHING, BESIDE) == [frozenset(), EVERYTHING, x, y]
    assert ends_round(proposals, EVERYTHING, TOGETHER) == [frozenset(), EVERYTHING]
    assert ends_round([x, y], EVERYTHING, BESIDE) == [x, y]  # no end: the round as proposed
    assert end_nodes(BESIDE, 4) == 1  # each end on one node, unsharded
    assert BESIDE in schedules(3) and BESIDE not in schedules(2)  # it needs a node beside


def search(beside: bool) -> Search:
    return Search(NAMES, noise=FIVE, trial_noise=TRIAL, costs=NODE, parallel=4,
                  end_nodes=1 if beside else 2, beside_ends=beside)


def test_the_first_round_fills_the_nodes_beside_the_ends_with_trials():
    """Told that the executor runs trials beside the ends, the search's first round is the two
    ends and two trials of its round design (each other than an end); without, it proposes
    only ends (a sharding executor splits them across the nodes)."""
    first = search(beside=True).next()
    assert first[:2] == [frozenset(), EVERYTHING] and len(first) == 4
    assert all(0 < len(s) < len(NAMES) for s in first[2:]) and first[2] != first[3]
    assert set(search(beside=False).next()) == {frozenset(), EVERYTHING}
    replayed = search(beside=True)  # a resumed search with records is past its first round
    replayed.record(frozenset(), V.PASS)
    replayed.record(EVERYTHING, V.FAIL)
    assert all(0 < len(s) < len(NAMES) for s in replayed.next())


def test_a_trial_beside_the_ends_starts_ahead_of_the_good_ends_run_as_the_bad_end_does():
    policy = ProbingPolicy({}, dict.fromkeys(NAMES, "on"), TrialPolicy(hot=True, sequential=True))
    beside = {"a": "on", "c": "on"}
    assert policy.starts_ahead(beside, 0, 0, BESIDE)
    assert not policy.starts_ahead(beside, 0, 0, TOGETHER)  # there only the bad end does
    assert not policy.starts_ahead(beside, 1, 0, BESIDE)  # not beside its block's good end
    assert not policy.starts_ahead({}, 0, 0, BESIDE)  # the good end itself
    assert policy.starts_ahead(dict.fromkeys(NAMES, "on"), 0, 0, BESIDE)
    # it finishes the probe it started (the ends' look) even where the bad end came back first
    known = {"good_end_fresh": True, "bad_known": True, "confirmation": False}
    assert policy.probe(beside, **known, ahead=True) is Probe.FULL
    assert policy.probe(beside, **known) is Probe.SEQUENTIAL


def test_the_plan_runs_the_trials_beside_the_ends_within_the_ends_round():
    """Four nodes: the good end and the bad end on one node each, unsharded, and the two
    trials beside them on the other two, launched at the round's start and probed at the ends'
    look 1 (not the full tier), then their drift scored once the good end's run is back, as the
    bad end's is: the round lasts as long as the ends do."""
    pool = NodePool(NODE, EVERYTHING, 4, sharded=True, ends=BESIDE)
    x, y = frozenset("ac"), frozenset("bd")
    done = pool.run_round([(frozenset(), False), (EVERYTHING, True), (x, False), (y, True)])
    assert len({t.node for t in done.trials}) == 4
    assert all(t.shards == 1 for t in done.trials)
    good = max(t.start_s + t.seconds for t in done.trials if t.trial == 0)
    bad_end = max(t.start_s + t.seconds for t in done.trials if t.trial == 1)
    for i in (2, 3):
        ahead, drift = sorted((t for t in done.trials if t.trial == i), key=lambda t: t.start_s)
        assert ahead.start_s == 0 and drift.start_s >= good  # judged after the good end's run
        probe = ahead.seconds + drift.seconds - NODE.launch_s
        assert probe < 0.2 * NODE.probe_s  # look 1's share, not the full tier
        assert drift.start_s + drift.seconds <= max(good, bad_end) + 1e-9
    assert done.wall_s == max(good, bad_end)


def test_beside_trials_hold_to_look_1s_rates_only_where_the_bad_end_settled_there():
    def slot(step: int, subset: frozenset[str], block: int = 0) -> _Slot:
        return _Slot(step, subset, block, None, {})  # type: ignore[arg-type]

    slots = [slot(0, frozenset()), slot(1, EVERYTHING), slot(2, frozenset("ac")),
             slot(3, frozenset("bd"))]

    def decisions(settled: bool, third: str = V.PASS) -> list[_Decision]:
        return [_Decision(V.PASS, None, 1, False), _Decision(V.FAIL, None, 2, False,
                                                              settled_at_look1=settled),
                _Decision(third, None, 3, False), _Decision(V.FAIL, None, 4, False)]

    out = beside_rates(slots, decisions(True), EVERYTHING, FIVE)
    assert [d.noise for d in out[:2]] == [None, None]  # the ends keep the bisect's own
    assert out[2].noise == out[3].noise == Noise(FIVE.false_fail, LOOK2_RISK)
    assert [d.noise for d in beside_rates(slots, decisions(False), EVERYTHING, FIVE)] == [None] * 4
    between = beside_rates(slots, decisions(True, V.BETWEEN), EVERYTHING, FIVE)
    assert between[2].noise is None  # evidence for neither side holds to no rate
    # a later round (no good end in it) is not beside the ends
    assert beside_rates(slots[1:], decisions(True)[1:], EVERYTHING, FIVE)[1].noise is None


class EndsBesideRunner(EndsAloneRunner):
    ends_schedule = BESIDE


class KeptSpec(BisectSpec):
    """The bisect's settings, keeping the search the driver builds from them (to read what it
    recorded)."""

    def search(self) -> Search:
        made = super().search()
        SEARCHES.append(made)
        return made


SEARCHES: list[Search] = []


def test_the_driver_runs_the_trials_beside_the_ends_in_the_ends_round(tmp_path):
    """--parallel 4 with BESIDE: the first round is the good end, the bad end and two trials,
    the runner told the good end's seed block (both the bad end and the trials start ahead of
    it), then rounds of up to four trials; the same culprits as the ends alone. The bad end's
    look 1 settled on accuracy, so the two trials beside it are recorded at look 1's rates."""
    runner = EndsBesideRunner({"a", "d"})
    everything = frozenset(DRIVER_NAMES)
    runner.verdicts = {everything: [TrialResult(V.FAIL, duration_s=1.0, details={
        "end_look": 1, "settled_by": "accuracy"})]}
    base = spec(parallel=4, beside_ends=True, end_nodes=1, noise=FIVE)
    kept = KeptSpec(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    SEARCHES.clear()
    with Ledger.open(tmp_path / "ledger.sqlite") as ledger:
        out = start_bisect(kept, runner, ledger, tmp_path / "run")
    assert out.result.culprits == {"a", "d"}
    assert runner.rounds[0] == 4 and runner.good_blocks[0] == 0
    first = [s for s, _ in runner.calls[:4]]
    assert {frozenset(), everything} <= set(first)
    beside = [s for s in first if s not in (frozenset(), everything)]
    assert len(beside) == 2 and all(0 < len(s) < len(DRIVER_NAMES) for s in beside)
    records = SEARCHES[-1].records
    assert [r.noise for r in records[:4] if r.subset in beside] == \
        [Noise(FIVE.false_fail, LOOK2_RISK)] * 2
    assert all(r.noise is None for r in records[4:])  # later trials: the runner's own rates


def test_the_plan_prices_trials_beside_the_ends_on_four_nodes():
    """The plan's simulation of a BESIDE bisect on four nodes finds the culprits (the search
    told of the nodes beside the ends through its memo's key) and its first round lasts as long
    as the ends, each on one node."""
    from dsv4bisect.bisect.plan.look_world import LookOne

    cfg = Setup(NAMES, FIVE, TRIAL, NODE, look1=LookOne(pairs=168))
    memo = search_memo(cfg, 4, True, BESIDE)
    culprits, seeds = common_draws(cfg, 40, 0)
    runs = [simulate(cfg, 4, c, random.Random(s), True, memo, True, 4, BESIDE)
            for c, s in zip(culprits, seeds)]
    assert sum(r.correct for r in runs) >= 38
    assert all(r.rounds[0].count == 4 for r in runs)


def after_beside_round() -> Search:
    """Four nodes after a first round with the ends and two trials beside them: ∅, the bad
    end's state {a, b}, {a} and {b} up, one node each."""
    made = search(beside=True)
    made.begin_round()
    for subset, outcome in ((frozenset(), V.PASS), (EVERYTHING, V.FAIL),
                            (frozenset("acdef"), V.PASS), (frozenset("bcdef"), V.FAIL)):
        made.record(subset, outcome)
    made.begin_round()
    assert sorted(map(sorted, made._tracker.engines)) == [[], ["a"], ["a", "b"], ["b"]]
    return made


def test_the_remedy_check_waits_rather_than_launch_into_a_round_of_switches():
    """The lead {c, d}: its checks switch, one of them in the bad end's state, the remedy
    check's too ({a, b, e, f}). Appended after them it would launch on another node and hold
    the round up by the launch; placed first it takes the bad end's node and the check moves to
    {a}; where the check has no other engine, the remedy check waits a round. It joins where
    the checks leave the bad end's node free, and in a round that launches anyway."""
    made = after_beside_round()
    cd, abc, rest = frozenset("cd"), frozenset("abc"), frozenset("abef")
    options = [[cd], [abc, frozenset("ac"), frozenset("bc")]]
    assert launches(made, [cd, abc, rest]) == [rest]  # today's fill: a launch
    placed = made._with_remedy([cd, abc], rest, options, 4)
    assert set(placed) == {rest, cd, frozenset("ac")} and launches(made, placed) == []
    assert made._with_remedy([cd, abc], rest, [[cd], [abc]], 4) == [cd, abc]
    free = [cd, frozenset("acd")]  # the bad end's node left free: the remedy switches there
    assert made._with_remedy(free, rest, [[cd], [frozenset("acd")]], 4) == [*free, rest]
    launching = [cd, frozenset("c")]  # two checks in ∅, one node of it: the round launches
    assert launches(made, launching) == [frozenset("c")]
    assert made._with_remedy(launching, rest, [[cd], [frozenset("c")]], 4) == [*launching, rest]
