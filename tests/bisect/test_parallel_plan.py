"""The node plan (`--plan --executor ray`): rounds of K trials on K nodes, as the Ray executor
runs them (bisect/plan/parallel_plan.py)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from dsv4bisect.bisect.plan.parallel_plan import choose_ends, node_counts, plan_nodes
from dsv4bisect.bisect.plan.simulate import NodePool, simulate
from dsv4bisect.bisect.plan.whole_plan import Setup, common_draws, plan_bisect
from dsv4bisect.bisect.rounds import ALONE, SCHEDULES, TOGETHER, ends_round, halves
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.pricing import StepCosts
from dsv4bisect.errors import BisectError

CANDIDATES = ("a", "b", "c", "d")
EVERYTHING = frozenset(CANDIDATES)
# SGLang-like: a launch, a hot switch, a full probe and its A/A repeat, the sequential trial
# probe's shares, one engine per node, one load-time candidate
HOT = StepCosts(launch_s=600, switch_s=90, probe_s=1200, aa_fraction=0.19, sequential=True,
                like_good_fraction=0.05, like_bad_fraction=0.03, hot=True, pool=1,
                load_time=frozenset({"a"}), paired=True)


def _setup(confirm: bool, ends0_cached: bool = False) -> Setup:
    return Setup(CANDIDATES, Noise(0.05, 0.05), Noise(0.01, 0.01),
                 replace(HOT, ends0_cached=ends0_cached), confirm=confirm)


# (ends0_cached: block 0's ends a failing `run` cached, which every node has from the start)
@pytest.mark.parametrize("ends0_cached", [False, True])
def test_one_node_is_the_single_node_plan_without_its_confirmation(ends0_cached: bool):
    single = plan_bisect(_setup(False, ends0_cached), trials=20, seed=2)
    nodes = plan_nodes(_setup(False, ends0_cached), (1,), trials=20, seed=2)
    for row, figures in ((nodes.row(1, True), single.with_levers),
                         (nodes.row(1, False), single.without_levers)):
        assert row.mean_wall_s == pytest.approx(figures.mean_wall_s, rel=1e-12)
        assert row.p90_wall_s == pytest.approx(figures.p90_wall_s, rel=1e-12)
        assert row.mean_trials == figures.mean_trials
        assert row.mean_launches == figures.mean_launches
        assert row.p_correct == figures.p_correct
        assert row.mean_rounds == row.mean_trials  # one trial per round
        assert row.mean_idle_slots == 0 and row.idle_share == 0
    # The single-node plan of a local bisect also prices the fresh confirmation, which the Ray
    # executor does not run (it cannot launch fresh), so the node plan is the same whether or
    # not its setup asks for one.
    confirmed = plan_bisect(_setup(True, ends0_cached), trials=20, seed=2).with_levers
    assert confirmed.phase_s["confirmation"] > 0
    assert plan_nodes(_setup(True, ends0_cached), (1,), trials=20, seed=2) == nodes


def test_the_node_columns_can_take_the_first_draws_of_a_longer_plan():
    """Rows of 10 runs on the first 10 culprit sets and outcome seeds of a 40-run plan (the
    CLI's node table beside its 200-run single-node plan)."""
    setup = _setup(confirm=False)
    culprits, seeds = common_draws(setup, 40, 2)
    walls = [simulate(setup, 2, c, random.Random(s), priced=True).wall_s
             for c, s in zip(culprits[:10], seeds[:10])]
    short = plan_nodes(setup, (2,), trials=10, seed=2, of=40)
    assert short.runs == 10
    assert short.row(2, True).mean_wall_s == pytest.approx(sum(walls) / 10)
    assert plan_nodes(setup, (2,), trials=10, seed=2).row(2, True) != short.row(2, True)


def _costs() -> StepCosts:
    return StepCosts(launch_s=100, switch_s=10, probe_s=1000, aa_fraction=0.5, sequential=True,
                     like_good_fraction=0.1, like_bad_fraction=0.2, hot=True, pool=1,
                     load_time=frozenset({"a"}), paired=True)


def test_rounds_idle_slots_and_idle_time_on_a_hand_checked_case():
    pool = NodePool(replace(_costs(), drift_fraction=0.1), frozenset("abc"), 2)
    # Round 1, the ends. Node 0: the good end = its baseline (launch 100 + full probe 1000 +
    # A/A 500). Node 1, at once: the bad end's engine (load-time state {a}: a launch) and its
    # accuracy requests (0.9 of the probe: 1000), then, once the good end's run is back (1600),
    # its drift scoring against it (0.1: 100); it measures no baseline of its own.
    first = pool.run_round([(frozenset(), False), (frozenset("abc"), True)])
    assert [(t.node, t.start_s, t.seconds, t.sequential) for t in first.trials] == [
        (0, 0, 1600, False), (1, 0, 1000, False), (1, 1600, 100, False)]
    assert (first.wall_s, first.idle_slots, first.idle_s) == (1700, 0, 700)
    assert pool.has_bad_end(1) and not pool.has_bad_end(0)
    # Round 2: the bad end came back to the driver, which sends it to node 0 too. {b} goes to
    # node 0, whose engine is up in its state (∅): a switch + 0.1 of the probe (110); {a} to
    # node 1 ({a} up): a switch + 0.2 of the probe, it fails like the bad end (210).
    second = pool.run_round([(frozenset("b"), False), (frozenset("a"), True)])
    assert pool.has_bad_end(0)
    assert [(t.node, t.seconds, t.sequential) for t in second.trials] == [
        (0, 110, True), (1, 210, True)]
    assert (second.wall_s, second.idle_s) == (210, 100)
    # Round 3, the remedy check alone: node 0 was free longest, but {a, c} needs the {a}
    # engine, which node 1 has up: a switch + 0.2 of the probe. Node 0 has no trial.
    third = pool.run_round([(frozenset("ac"), True)])
    assert [(t.node, t.seconds, t.sequential) for t in third.trials] == [(1, 210, True)]
    assert (third.wall_s, third.idle_slots, third.idle_s) == (210, 1, 210)
    assert pool.launches == 2  # node 0: base(∅); node 1: {a}


def _wall(costs: StepCosts, sequence: list[tuple[frozenset[str], bool]], nodes: int) -> float:
    pool = NodePool(costs, EVERYTHING, nodes)
    return sum(pool.run_round(sequence[i:i + nodes]).wall_s
               for i in range(0, len(sequence), nodes))


def _sequences(n: int, seed: int) -> list[list[tuple[frozenset[str], bool]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        trials = [(frozenset(c for c in CANDIDATES if rng.random() < 0.5), rng.random() < 0.5)
                  for _ in range(rng.randint(0, 14))]
        out.append([(frozenset(), False), (EVERYTHING, True), *trials])
    return out


def test_more_nodes_never_lengthen_a_trial_sequence_that_costs_the_same_on_any_node():
    """1, 2, 4 nodes: a round of 2K trials lasts at most as long as the two rounds of K it
    merges. Holds whenever a trial's price does not depend on its node (every trial a fresh
    launch and a full probe, with no per-node baseline)."""
    flat = StepCosts(launch_s=600, probe_s=1200)
    for sequence in _sequences(300, seed=1):
        one, two, four = (_wall(flat, sequence, k) for k in (1, 2, 4))
        assert four <= two <= one
        assert one == pytest.approx(1800 * len(sequence))


def test_ends_shared_after_their_round_make_two_nodes_faster_than_one():
    """The Ray executor's policy: the ends a node measured travel to every node with its next
    trial, so a node that never ran the bad end probes sequentially and measures no baseline
    another node measured. The same trials take less time on two nodes."""
    sequence = [(frozenset(), False), (frozenset("abc"), True), (frozenset("b"), False),
                (frozenset("a"), True), (frozenset("bc"), False)]
    costs = _costs()
    pool = NodePool(costs, frozenset("abc"), 1)
    one = sum(pool.run_round([t]).wall_s for t in sequence)
    # 1600 (good end) + 1100 (bad end: its engine, full probe) + 200 ({b}: launch, 0.1) +
    # 300 ({a}: launch, 0.2) + 200 ({b, c}: launch, 0.1)
    assert one == 3400
    two = NodePool(costs, frozenset("abc"), 2)
    rounds = [two.run_round(sequence[:2]), two.run_round(sequence[2:4]),
              two.run_round(sequence[4:])]
    # 1600 (the ends at once: the good end's 1600; the bad end's launch and probe, 1100, is
    # judged against it when it is back: no drift scoring to wait for here) + 210 ({b} and
    # {a}: both switches) + 110 ({b, c} on node 0, whose ∅ engine is up)
    assert [r.wall_s for r in rounds] == [1600, 210, 110]
    assert sum(r.wall_s for r in rounds) == 1920 < one


def test_within_a_round_no_node_has_what_another_measures_in_it():
    """A trial beside the good end that is not the bad end of its block measures block 0's
    baseline itself (their trials start at once), the bad end beside it does not (its probe
    starts ahead and is judged against the good end's run); in the next round every node has
    the ends (node 1 too, which never measured a baseline): each probes sequentially."""
    costs = replace(_costs(), load_time=frozenset())
    pool = NodePool(costs, frozenset("abc"), 3)
    first = pool.run_round([(frozenset(), False), (frozenset("abc"), True),
                            (frozenset("b"), False)])
    assert [(t.node, t.seconds) for t in first.trials] == [
        (0, 1600), (1, 1100), (1, 0), (2, 1600 + 10 + 1000)]  # {b}: its own baseline
    assert pool.trackers[1].baselines == set()
    second = pool.run_round([(frozenset("b"), False), (frozenset("c"), False),
                             (frozenset("bc"), False)])
    # every node has an engine up in the state ∅ (no load-time candidate): a switch each,
    # 0.1 of the probe
    assert sorted((t.node, t.seconds, t.sequential) for t in second.trials) == [
        (0, 110, True), (1, 110, True), (2, 110, True)]
    assert pool.trackers[1].baselines == pool.trackers[2].baselines == {0}


def test_fresh_launches_share_no_baseline_between_nodes():
    """Without hot runners (--fresh-launches) each node measures its own baselines, as the
    node's baseline cache does."""
    flat = StepCosts(launch_s=100, probe_s=1000, aa_fraction=0.5, paired=True)
    pool = NodePool(flat, frozenset("abc"), 2)
    pool.run_round([(frozenset(), False)])
    second = pool.run_round([(frozenset("b"), False), (frozenset("c"), False)])
    # node 1 measures block 0's baseline again (1600) before its trial (1100)
    assert sorted((t.node, t.seconds) for t in second.trials) == [(0, 1100), (1, 2700)]


def test_seed_blocks_are_the_drivers_across_nodes():
    """A re-test of the bad end on another node is its block 1: that node measures block 1's
    baseline (not block 0's, which its own count would give); block 0's came from the driver."""
    costs = replace(_costs(), load_time=frozenset())
    pool = NodePool(costs, frozenset("abc"), 2)
    pool.run_round([(frozenset("abc"), True)])  # node 0: baseline 0 + bad end
    second = pool.run_round([(frozenset("b"), False)])  # node 0: its engine is up
    assert [t.node for t in second.trials] == [0]
    again = pool.run_round([(frozenset("abc"), True), (frozenset("abc"), True)])
    assert pool.trackers[0].baselines == {0, 1} and pool.trackers[1].baselines == {0, 2}
    assert [t.node for t in again.trials] == [0, 1]


def test_plan_nodes_on_k_nodes_reports_rounds_and_idle_slots():
    plan = plan_nodes(_setup(confirm=False), node_counts(3), trials=8, seed=1)
    assert [(r.nodes, r.levers, r.sharded) for r in plan.rows] == [
        (k, on, sharded) for k in (1, 2, 3, 4) for on in (True, False)
        for sharded in (False, True)]
    for r in plan.rows:
        assert r.mean_rounds <= r.mean_trials <= r.mean_rounds * r.nodes
        assert 0 <= r.idle_share < 1 and r.p_correct > 0.5
    assert plan.row(4, True).mean_rounds < plan.row(1, True).mean_rounds
    assert plan.row(1, True).mean_wall_s < plan.row(1, False).mean_wall_s  # the levers
    assert plan.row(4, False).mean_wall_s < plan.row(1, False).mean_wall_s  # fresh launches
    assert plan == plan_nodes(_setup(confirm=False), node_counts(3), trials=8, seed=1)


def test_bad_arguments_are_errors():
    with pytest.raises(BisectError):
        plan_nodes(_setup(confirm=False), (1,), trials=0)
    with pytest.raises(BisectError):
        plan_nodes(_setup(confirm=False), (0, 2), trials=2)
    with pytest.raises(ValueError):
        NodePool(_costs(), frozenset("abc"), 1).run_round([(frozenset(), False)] * 2)


# -- sharded probes (a trial's probe split across nodes that each run its configuration) ------

def test_an_end_alone_is_sharded_across_every_node_one_after_the_other():
    """Four nodes, the ends as the sharding executor runs them (bisect/rounds.py): the good end
    alone on all four, each its own launch 600 + (1000 + 500) / 4 of its baseline and A/A
    repeat; then the bad end alone on all four, a launch 600 + 1000 / 4, judged against the
    good end the driver sent (no node measures a baseline of its own)."""
    pool = NodePool(replace(_costs(), launch_s=600), frozenset("abc"), 4, sharded=True)
    good = pool.run_round([(frozenset(), False)])
    bad = pool.run_round([(frozenset("abc"), True)])
    assert sorted((t.node, t.seconds, t.shards) for t in good.trials) == [
        (n, 975, 4) for n in range(4)]
    assert sorted((t.node, t.seconds, t.shards) for t in bad.trials) == [
        (n, 850, 4) for n in range(4)]
    assert good.wall_s + bad.wall_s == 1825 and good.idle_s == bad.idle_s == 0
    assert pool.launches == 8 and all(pool.has_bad_end(n) for n in range(4))
    # both ends at once, each on its own node (--no-shard): the bad end's node launches and
    # sends its accuracy requests (600 + 900) while the good end runs (600 + 1500), then
    # scores its drift transcripts (100) against the good end's run: 2200 in all (it measured
    # its own baseline first before the probe could start ahead: 3700)
    plain = NodePool(replace(_costs(), launch_s=600, drift_fraction=0.1), frozenset("abc"),
                     4).run_round([(frozenset(), False), (frozenset("abc"), True)])
    assert plain.wall_s == 2200


def test_ends_round_runs_the_ends_by_themselves_alone_or_together_else_the_whole_round():
    everything = frozenset("abc")
    mixed = [frozenset("a"), everything, frozenset(), everything]
    assert ends_round(mixed, everything, ALONE) == [everything]
    assert ends_round([frozenset(), everything], everything, ALONE) == [frozenset()]
    assert ends_round(mixed, everything, TOGETHER) == [frozenset(), everything]
    assert ends_round([everything, frozenset("a")], everything, TOGETHER) == [everything]
    others = [frozenset("a"), frozenset("bc")]
    for schedule in (ALONE, TOGETHER, None):
        assert ends_round(others, everything, schedule) == others
    assert ends_round(mixed, everything, None) == mixed  # not sharding: as proposed
    with pytest.raises(ValueError):
        ends_round(mixed, everything, "sideways")
    assert [halves(k) for k in (1, 2, 3, 4, 8)] == [1, 1, 1, 2, 4]


def test_both_ends_together_each_on_its_half_the_bad_end_started_ahead():
    """Four nodes, TOGETHER: the good end on two nodes, each a launch 600 + (1000 + 500) / 2
    of its baseline and A/A repeat (1350); the bad end on the other two, each a launch 600 and
    its share of the accuracy requests (1000 x 0.9 / 2) at once, then, once the good end's run
    is back (1350), its share of the drift scoring (1000 x 0.1 / 2): 1400 in all, against
    975 + 850 = 1825 with each end alone on every node. No bad-end node measures a baseline."""
    costs = replace(_costs(), launch_s=600, drift_fraction=0.1)
    pool = NodePool(costs, frozenset("abc"), 4, sharded=True, ends=TOGETHER)
    both = pool.run_round([(frozenset(), False), (frozenset("abc"), True)])
    good = sorted((t.node, t.start_s, t.seconds, t.shards) for t in both.trials if t.trial == 0)
    bad = sorted((t.node, t.start_s, t.seconds, t.shards) for t in both.trials if t.trial == 1)
    assert good == [(0, 0, 1350, 2), (1, 0, 1350, 2)]
    assert bad == [(2, 0, 1050, 2), (2, 1350, 50, 2), (3, 0, 1050, 2), (3, 1350, 50, 2)]
    assert both.wall_s == 1400 and both.count == 2 and both.idle_slots == 0
    assert both.idle_s == 4 * 1400 - (2 * 1350 + 2 * 1100)  # the bad end's wait
    assert pool.launches == 4 and all(pool.trackers[n].baselines == set() for n in (2, 3))
    assert pool.trackers[0].baselines == {0}


def test_a_sharded_bisect_measures_the_ends_alone_first_then_trials_side_by_side():
    """The simulated sharded bisect on four nodes: its first two rounds are the good end, then
    the bad end, each alone on every node; every later trial that is not an end has a node of
    its own (never a shard)."""
    setup = _setup(confirm=False)
    culprits, seeds = common_draws(setup, 6, 1)
    for c, s in zip(culprits, seeds):
        run = simulate(setup, 4, c, random.Random(s), priced=True, sharded=True)
        first, second = run.rounds[:2]
        assert [(t.node, t.shards) for t in first.trials] == [(n, 4) for n in range(4)]
        assert [t.shards for t in second.trials] == [4] * 4
        for rd in run.rounds[2:]:
            assert all(t.shards == 1 for t in rd.trials) or (
                rd.count == 1 and rd.trials[0].shards == 4)
            assert len({t.node for t in rd.trials}) == len(rd.trials)


def test_one_trial_a_round_on_two_nodes_runs_the_ends_one_after_the_other_on_both():
    """--nodes 2 --parallel 1: each round's one trial on both nodes. Without a load-time
    candidate: the good end 100 + 1500 / 2 on each, then the bad end a switch 10 + 1000 / 2."""
    pool = NodePool(replace(_costs(), load_time=frozenset()), frozenset("abc"), 2, sharded=True)
    good = pool.run_round([(frozenset(), False)])
    bad = pool.run_round([(frozenset("abc"), True)])
    assert sorted((t.node, t.seconds, t.shards) for t in good.trials) == [(0, 850, 2),
                                                                         (1, 850, 2)]
    assert sorted((t.node, t.seconds, t.shards) for t in bad.trials) == [(0, 510, 2),
                                                                        (1, 510, 2)]
    assert good.idle_s == bad.idle_s == 0


def test_a_lone_trial_that_is_no_end_runs_on_one_node_the_others_idle():
    """After the ends (each alone on all four nodes), one trial: on one node, unsharded (its
    probe, 0.2 of a full one, is shorter than a replica's switch); a node whose engine is up in
    its load-time state takes it (a switch, not a launch)."""
    pool = NodePool(replace(_costs(), launch_s=600), frozenset("abc"), 4, sharded=True)
    pool.run_round([(frozenset(), False)])
    pool.run_round([(frozenset("abc"), True)])
    # {a, b}: load-time state {a}, up on every node (the bad end's); fails like the bad end
    second = pool.run_round([(frozenset("ab"), True)])
    assert [(t.seconds, t.shards, t.sequential) for t in second.trials] == [(210, 1, True)]
    assert second.idle_slots == 3 and second.wall_s == 210  # a switch 10 + 1000 x 0.2


def test_sharding_changes_no_outcome_stream_and_one_node_is_unchanged():
    setup = _setup(confirm=False)
    culprits, seeds = common_draws(setup, 12, 3)
    for c, s in zip(culprits, seeds):
        plain = simulate(setup, 1, c, random.Random(s), priced=True)
        assert simulate(setup, 1, c, random.Random(s), priced=True, sharded=True) == plain


def test_a_sharded_bisect_finds_the_same_culprits_and_more_nodes_shorten_it():
    plan = plan_nodes(_setup(confirm=False), (1, 2, 4), trials=12, seed=4)
    one = plan.row(1, True).mean_wall_s
    for k in (2, 4):
        sharded, plain = plan.row(k, True, True), plan.row(k, True, False)
        # (on two nodes the ends together take a node each, as unsharded: it may tie)
        assert sharded.mean_wall_s <= plain.mean_wall_s < 1.2 * one
        assert k == 2 or sharded.mean_wall_s < plain.mean_wall_s
        assert sharded.round_size in (k, (k + 1) // 2, 1) and sharded.p_correct >= 0.9
        assert sharded.mean_trials == pytest.approx(sharded.mean_trials)  # a count, not shards
    assert plan.row(4, True, True).mean_wall_s < plan.row(2, True, True).mean_wall_s
    # the floor: the ends and the culprits' trial; every bisect runs at least that
    for k in (1, 2, 4):
        assert 0 < plan.floor(k) <= plan.row(k, True, True).mean_wall_s
    assert plan.floor(4) < plan.floor(1)


def test_a_round_size_above_the_nodes_is_refused():
    with pytest.raises(ValueError, match="proposals a round"):
        simulate(_setup(confirm=False), 2, frozenset("a"), random.Random(0), True,
                 round_size=3)


def test_the_plan_and_the_executor_share_one_choice_of_how_the_ends_run():
    """The sharded row of K nodes is the shorter of the two schedules (bisect/rounds.py), and
    `choose_ends` (what the CLI gives the Ray executor) picks the same one for its round size.
    Without a load-time candidate the bad end after the good end is a switch on every node,
    cheaper than half of the good end's A/A repeat (here the whole probe again, as at the ci
    tier): ALONE; a launch for the bad end that costs more than that share of the probe makes
    TOGETHER shorter on four nodes."""
    setup = _setup(confirm=False)
    plan = plan_nodes(setup, (1, 2, 4), trials=12, seed=4)
    for k in (2, 4):
        row = plan.row(k, True, True)
        assert row.ends in SCHEDULES and plan.row(k, True, False).ends is None
        assert choose_ends(setup, k, row.round_size, trials=12, of=12, seed=4) == row.ends
    assert plan.row(1, True, True).ends is None
    switch = replace(setup, costs=replace(HOT, load_time=frozenset(), aa_fraction=1.0,
                                          drift_fraction=0.01))
    assert choose_ends(switch, 2, 2, trials=12, of=12, seed=4) == ALONE
    launch = replace(setup, costs=replace(HOT, drift_fraction=0.01))
    assert choose_ends(launch, 4, 2, trials=12, of=12, seed=4) == TOGETHER
    assert choose_ends(launch, 1, 1, trials=12, of=12, seed=4) == ALONE


@pytest.mark.parametrize("sharded", [False, True])
def test_the_ends_a_run_cached_cost_no_node_anything_and_every_node_probes_sequentially(
        sharded: bool):
    """Seed block 0's ends a failing `run` cached (`ends0_cached`): the Ray driver sends them
    with every node's first trial (cluster/shared_ends.py `keep_run`), so both ends of block 0
    cost nothing on one node each (no replica, the bad end started ahead of nothing), and the
    next trials are sequential on every node from the next round."""
    costs = replace(_costs(), launch_s=600, drift_fraction=0.1, ends0_cached=True)
    pool = NodePool(costs, frozenset("abc"), 4, sharded=sharded, ends=TOGETHER)
    ends = pool.run_round([(frozenset(), False), (frozenset("abc"), True)])
    assert [(t.seconds, t.shards) for t in ends.trials] == [(0, 1), (0, 1)]
    assert ends.wall_s == 0 and pool.launches == 0
    assert all(pool.has_bad_end(n) for n in range(4))
    trials = pool.run_round([(frozenset("a"), True), (frozenset("b"), False)])
    assert all(t.sequential for t in trials.trials)
    # the bad end's re-test (seed block 1) measures its block's ends as before
    again = pool.run_round([(frozenset("abc"), True)])
    assert sum(t.seconds for t in again.trials) > 0
