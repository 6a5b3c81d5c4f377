"""`--plan` prices each seed block's ends by their two looks (bisect/end_looks.py): look 1's
computed tokens, look 2 where the simulated world's bad end does not settle at look 1, and the
trials on look 1's grid (bisect/plan/look_world.py, costs.py, simulate.py)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from dsv4bisect.bisect.end_looks import look_spec
from dsv4bisect.bisect.plan.costs import plan_costs, probe_shape
from dsv4bisect.bisect.plan.look_world import LookOne, look_cells, look_trial
from dsv4bisect.bisect.plan.simulate import Setup, common_draws, simulate
from dsv4bisect.bisect.plan.whole_plan import plan_bisect
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.pricing import CostTracker, StepCosts
from dsv4bisect.probe.grid import accuracy_answers, cells
from dsv4bisect.probe.sequential_plan import plan_trial
from dsv4bisect.probe.spec import cases_kept, tier_spec

CANDIDATES = ("a", "b", "c", "d")
EVERYTHING = frozenset(CANDIDATES)
FULL = StepCosts(launch_s=600, switch_s=90, probe_s=2800, aa_fraction=0.18, sequential=True,
                 like_good_fraction=0.04, like_bad_fraction=0.035, hot=True, pool=1,
                 load_time=frozenset({"a"}), paired=True, drift_fraction=0.007)
LOOKS = replace(FULL, look1_fraction=0.27, look1_aa_fraction=0.05, look2_chance=0.0,
                look2_fraction=0.75)


def _look1(spec):
    """The ends' look 1 of `spec`, as the runner probes it."""
    return look_spec(spec, 1)


def _strata(grid):
    out: Counter[tuple[str, int]] = Counter()
    for cell, n in grid:
        out[(cell.family, cell.length)] += n
    return out


@pytest.mark.parametrize("tier", ["ci", "smoke", "standard", "deep"])
def test_a_look_keeps_its_share_of_every_stratum_and_every_drift_transcript(tier):
    spec = tier_spec(tier)
    whole, look = _strata(cells(spec)), _strata(look_cells(_look1(spec)))
    for (family, length), n in whole.items():
        kept = n if family == "drift" else cases_kept(n, _look1(spec).case_share)
        assert look[(family, length)] == kept
    assert look_cells(spec) == cells(spec)  # share 1: the tier
    again = look_cells(_look1(spec))
    assert again == look_cells(_look1(spec))  # seeded: the same draw every time
    other = look_cells(_look1(spec).replace(seed_block=3))
    assert _strata(other) == _strata(again)  # another block draws other cells, as many


@pytest.mark.parametrize("tier", ["smoke", "standard"])
@pytest.mark.parametrize("share", [1.0, 0.25, 0.06])
def test_the_answers_look_one_is_sized_by_are_the_ones_the_plan_prices(tier, share):
    spec = tier_spec(tier).replace(case_share=share)
    assert accuracy_answers(spec) == probe_shape(spec).accuracy_requests


def test_look_one_prices_its_share_of_the_computed_tokens_the_polluting_phase_whole():
    spec = tier_spec("standard")
    full, look = probe_shape(spec), probe_shape(_look1(spec))
    drift = dict(full.by_condition)["drift"]
    assert dict(look.by_condition)["drift"] == drift  # every drift transcript
    accuracy = full.computed - drift
    kept = cases_kept(84, _look1(spec).case_share)  # of the 84 cases of every stratum
    assert kept < 84 / 4  # below a quarter: look 1 is sized by its question (end_looks.py)
    assert look.computed - drift == pytest.approx(accuracy * kept / 84)
    assert look.warmup_tokens == full.warmup_tokens > 0
    assert look.accuracy_requests == full.accuracy_requests * kept // 84
    costs = plan_costs("sglang", full, given={}, look1=look)
    c = costs.costs
    assert c.looks and c.look1_fraction == pytest.approx(
        (look.computed + look.warmup_tokens) / (full.computed + full.warmup_tokens))
    assert c.look1_aa_fraction == pytest.approx(look.aa_share * c.look1_fraction)
    assert costs.look1 == LookOne(look.accuracy_requests)
    named = {line.name: line.value for line in costs.lines}
    assert named["ends, look 1"] == c.look1_fraction
    assert named["ends, look 1, A/A repeat"] == c.look1_aa_fraction
    assert named["ends, look 2"] == c.look2_chance
    # look 2 sends only the cases look 1 did not keep (and the polluting phase again)
    assert c.look2_fraction == pytest.approx(
        (full.computed - look.computed + full.warmup_tokens) / (full.computed + full.warmup_tokens))
    assert named["ends, look 2, each end"] == c.look2_fraction


def test_where_look_one_keeps_every_case_the_ends_are_priced_as_the_full_tier():
    """The ci tier keeps its one case per stratum at look 1: there is no second look, and the
    plan is the full tier's to the bit."""
    spec = tier_spec("ci")
    full, look = probe_shape(spec), probe_shape(_look1(spec))
    assert (look.computed, look.accuracy_requests) == (full.computed, full.accuracy_requests)
    for engine in ("sglang", "reference"):
        with_looks = plan_costs(engine, full, given={}, look1=look)
        assert with_looks == plan_costs(engine, full, given={})
        assert not with_looks.costs.looks and with_looks.look1 is None
    # the trial probe on look 1's grid is the tier's
    asked = {"loss_rate": 0.14, "sims": 20}
    assert look_trial(_look1(spec), 0.01, 0.01, 0.14, 20) == plan_trial(
        spec, 0.01, 0.01, **asked)


def test_the_trial_probe_on_a_whole_look_is_the_sequential_plans_own():
    spec = tier_spec("smoke")
    assert look_trial(spec, 0.01, 0.01, 0.14, 20) == plan_trial(spec, 0.01, 0.01, loss_rate=0.14,
                                                               sims=20)


def test_look_two_comes_at_the_chance_the_world_gives_and_settles_by_end_looks_rule():
    # exact one-sided McNemar with none gained: p = 2^-b, settled at p <= 0.005 from b = 8
    world = LookOne(100)
    rng = random.Random(4)
    unsettled = sum(not world.settles(rng) for _ in range(4000)) / 4000
    assert unsettled == pytest.approx(world.look2_chance, abs=0.015)
    assert 0.02 < world.look2_chance < 0.1
    assert 0 < LookOne(600).look2_chance < 1e-20  # the standard tier's look 1: ~600 answers
    assert LookOne(5).look2_chance == 1.0  # too few answers ever to settle
    assert LookOne(100, loss_rate=0.3).look2_chance < world.look2_chance


def test_a_bad_end_whose_look_one_settles_costs_less_and_one_that_does_not_costs_more():
    def bad_end(costs, look2):
        tracker = CostTracker(costs, EVERYTHING)
        good = tracker.charge(frozenset(), False)
        return good + tracker.charge(EVERYTHING, True, look2=look2)

    full = bad_end(FULL, None)
    assert bad_end(LOOKS, False) < full < bad_end(LOOKS, True)
    # look 2: both ends on the cases look 1 did not keep and the A/A repeat's rest, each in
    # its engine (a launch: "a" is load-time)
    rest = FULL.probe_s * (2 * LOOKS.look2_fraction + FULL.aa_fraction - LOOKS.look1_aa_fraction)
    assert bad_end(LOOKS, True) - bad_end(LOOKS, False) == pytest.approx(2 * 600 + rest)
    # a quote prices look 2 at its chance
    quoted = replace(LOOKS, look2_chance=0.5)
    assert bad_end(quoted, None) - bad_end(quoted, False) == pytest.approx(
        0.5 * (rest + 2 * 90))


def _setup(costs, look1):
    return Setup(CANDIDATES, Noise(0.05, 0.05), Noise(0.01, 0.01), costs, confirm=False,
                 look1=look1)


def test_a_world_whose_look_one_settles_costs_less_with_the_same_outcomes():
    full = plan_bisect(_setup(FULL, None), trials=30, compare=False).with_levers
    settles = plan_bisect(_setup(LOOKS, LookOne(600)), trials=30, compare=False).with_levers
    never = plan_bisect(_setup(LOOKS, LookOne(5)), trials=30, compare=False).with_levers
    assert settles.mean_wall_s < full.mean_wall_s < never.mean_wall_s
    assert settles.phase_s["ends"] < full.phase_s["ends"]
    # the looks draw on a stream of their own: every bisect runs the same trials and outcomes
    assert (settles.mean_trials, settles.p_correct) == (full.mean_trials, full.p_correct)
    assert (never.mean_trials, never.p_correct) == (full.mean_trials, full.p_correct)


def test_each_bad_end_draws_its_look_and_shards_share_the_draw():
    setup = _setup(LOOKS, LookOne(100))
    culprits, seeds = common_draws(setup, 20, 1)
    looks = Counter()
    for c, s in zip(culprits, seeds):
        run = simulate(setup, 2, c, random.Random(s), True, sharded=True)
        for rnd in run.rounds:
            for trial in {t.trial: t for t in rnd.trials if t.look}.values():
                looks[trial.look] += 1
            by_trial = {(t.trial, t.look) for t in rnd.trials if t.look}
            assert len({trial for trial, _ in by_trial}) == len(by_trial)
    assert looks[1] > looks[2] > 0


def test_looks_are_the_hot_sequential_runners_and_need_their_world():
    setup = _setup(LOOKS, LookOne(100))
    for off in (("hot",), ("sequential",)):
        without = setup.without(off)
        assert not without.costs.looks and without.look1 is None
    with pytest.raises(ValueError, match="look 1's world"):
        _setup(LOOKS, None)
    assert StepCosts.from_json(LOOKS.to_json()) == LOOKS
    assert "look1_fraction" not in FULL.to_json()  # full ends keep their JSON


@pytest.mark.slow  # the standard tier's trial plan on look 1's grid and 100 bisects a row: ~1 min
def test_the_plan_of_an_sglang_profile_prices_its_ends_by_the_two_looks(cli, tmp_path):
    import json

    from dsv4bisect.bisect.plan.parallel_plan import plan_nodes

    r = cli("bisect", "dsv4-flash-tp8-all", "--plan", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = {c["name"]: c for c in json.loads(r.stdout)["costs"]}
    assert lines["ends, look 1"]["value"] == pytest.approx(0.0913, abs=0.001)
    assert "5.5 M of 70.3 M computed prompt tokens" in lines["ends, look 1"]["source"]
    assert "P(look 2) <= 0.001" in lines["ends, look 1"]["source"]
    assert lines["ends, look 2"]["value"] < 1e-3  # 168 paired answers settle a 14 % loss
    trial = lines["trial probe, like the bad end"]
    assert "on the cases of the ends' look 1" in trial["source"] and trial["value"] < 0.05
    # the same bisect with its ends at the full tier
    from dsv4bisect.bisect.session import ask
    from dsv4bisect.bisect.setup import BisectRequest, prepare

    request = BisectRequest(profile="dsv4-flash-tp8-all", plan_only=True)
    setup = prepare(ask(request), request).setup()
    full = replace(setup, costs=setup.costs.full_ends(), look1=None)
    looks, whole = (plan_nodes(s, (1,), trials=100).row(1, True) for s in (setup, full))
    assert looks.mean_wall_s < whole.mean_wall_s - 2000


def test_the_trial_plan_of_a_look_is_simulated_on_its_grid_and_cached():
    from dsv4bisect.bisect.plan.trial_plan_cache import planned_trial

    look = _look1(tier_spec("smoke"))
    direct = look_trial(look, 0.01, 0.01, 0.14, 20)
    assert planned_trial(look, 0.01, 0.01, loss_rate=0.14, sims=20) == direct  # simulated
    assert planned_trial(look, 0.01, 0.01, loss_rate=0.14, sims=20) == direct  # read back
    assert direct.full_requests < plan_trial(tier_spec("smoke"), 0.01, 0.01, loss_rate=0.14,
                                             sims=20).full_requests


def test_a_sharded_look_two_probes_the_good_end_whole_on_the_trials_node_after_look_one():
    """On Ray (NodePool, sharded) a bad end whose look 1 does not settle probes look 2 as the
    node runs it (HotEngineRunner with replicas): the good end's baseline and A/A repeat whole
    on the trial's own node (its replicas serve the bad end's configuration only), then the bad
    end's full tier split across the trial's nodes; beside the good end of its round
    (TOGETHER) all of it after the look-1 verdict, which waits for the good end's run."""
    from dsv4bisect.bisect.plan.simulate import NodePool
    from dsv4bisect.bisect.rounds import ALONE, TOGETHER

    c = LOOKS
    for ends in (ALONE, TOGETHER):
        never = NodePool(c, EVERYTHING, 4, sharded=True, ends=ends, settles=lambda: False)
        settled = NodePool(c, EVERYTHING, 4, sharded=True, ends=ends, settles=lambda: True)
        pair = [(frozenset(), False), (EVERYTHING, True)]
        rounds = [pair] if ends == TOGETHER else [[p] for p in pair]
        walls = [[pool.run_round(r) for r in rounds] for pool in (never, settled)]
        shards = [t for t in walls[0][-1].trials if t.look == 2]
        own, *replicas = sorted({t.node for t in shards}, key=lambda n: n != shards[0].node)
        look2 = {t.node: t.look2_s for t in shards if t.look2_s}
        # the own node: the good end's engine and the bad end's again (launches: "a" is
        # load-time and one engine is up at once), the good end's rest whole (the cases look 1
        # did not keep, the A/A repeat's rest), its share of the bad end's rest
        shares = len({t.node for t in shards})
        rest = c.probe_s * c.look2_fraction
        good = rest + c.probe_s * (c.aa_fraction - c.look1_aa_fraction)
        assert look2[own] == pytest.approx(2 * c.launch_s + good + rest / shares)
        assert all(look2[n] == pytest.approx(rest / shares) for n in replicas)
        if ends == TOGETHER:  # after the good end's trial: its look-1 verdict needs that run
            good_done = max(t.start_s + t.seconds for t in walls[0][0].trials if t.trial == 0)
            after = [t for t in shards if t.look2_s]
            assert after and all(t.start_s >= good_done for t in after)
        assert sum(r.wall_s for r in walls[0]) > sum(r.wall_s for r in walls[1]) + rest


@pytest.mark.slow  # two plans of the standard tier on 1, 2 and 4 nodes: ~2-3 min on 2 cores
def test_the_ray_node_plan_prices_the_ends_two_looks_below_full_ends(cli, tmp_path):
    """`--plan --executor ray --parallel 4` runs the ends in two looks as locally, and its node
    table prices them: every row with the levers is shorter than with `--full-ends`."""
    import json

    plan = ("bisect", "dsv4-flash-tp8-all", "--plan", "--executor", "ray", "--parallel", "4",
            "--no-confirm", "--json")
    looks, full = (json.loads(r.stdout) for r in (cli(*plan, cwd=tmp_path),
                                                   cli(*plan, "--full-ends", cwd=tmp_path)))
    assert "ends, look 1" in {c["name"] for c in looks["costs"]}
    assert "ends, look 1" not in {c["name"] for c in full["costs"]}
    rows = {kind: {(r["nodes"], r["sharded"]): r for r in doc["nodes"]["rows"] if r["levers"]}
            for kind, doc in (("looks", looks), ("full", full))}
    assert sorted(rows["looks"]) == sorted(rows["full"]) and len(rows["looks"]) >= 6
    for key, row in rows["looks"].items():
        assert row["mean_wall_s"] < rows["full"][key]["mean_wall_s"], key
        assert row["p_correct"] >= 0.97, key


def test_the_ends_look_twice_only_where_that_is_priced_cheaper():
    """Look 2 probes both ends again in their engines: on one SGLang node (one engine) that is
    two launches, so where look 1 cannot settle the smallest loss (smoke: P(look 2) 0.92) one
    look at the full tier is cheaper, and the bisect takes it, saying why; where look 1 settles
    (standard), or look 2 only switches (the embedded engine keeps both ends' engines up), the
    ends look twice."""
    from dsv4bisect.bisect.search.pricing import ends_seconds
    from dsv4bisect.bisect.session import ask
    from dsv4bisect.bisect.setup import BisectRequest, prepare

    def prepared(profile, **kw):
        request = BisectRequest(profile=profile, plan_only=True, **kw)
        return prepare(ask(request), request)

    smoke = prepared("dsv4-flash-tp8-latest-all", tier="smoke")
    assert smoke.request.policy.full_ends and not smoke.spec.costs.looks
    assert smoke.ends_note is not None and "one look at the full tier" in smoke.ends_note
    assert smoke.setup().look1 is None
    embedded = prepared("reference-all")
    assert embedded.request.policy.end_looks and embedded.ends_note is None
    asked = prepared("dsv4-flash-tp8-latest-all", tier="smoke", full_ends=True)
    assert asked.request.policy.full_ends and asked.ends_note is None  # as asked, no note
    # the price behind the choice: look 2 at its chance, both ends' engines launched again
    everything = frozenset(CANDIDATES)
    c = LOOKS  # the standard tier's shares on one SGLang node, look 1 all but sure to settle
    assert ends_seconds(c, everything) < ends_seconds(c.full_ends(), everything)
    sure = replace(c, look2_chance=1.0)
    assert ends_seconds(sure, everything) > ends_seconds(c.full_ends(), everything)
    assert ends_seconds(sure, everything) - ends_seconds(replace(c, look2_chance=0.0),
                                                         everything) > 2 * c.launch_s
