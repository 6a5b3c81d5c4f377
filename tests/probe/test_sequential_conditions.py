"""A sequential trial replays every request under the condition the ends measured it in: a
concurrency-1 request alone, a request of a level above 1 with its whole concurrency group (the
same batch mates, in the fixed probe's seeded submission order). Pure: hand-made ends and runs."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.grid import Case, Cell
from dsv4bisect.probe.run import ProbeRun, row_key
from dsv4bisect.probe.tasks import submission_order, tasks_of
from dsv4bisect.probe.sequential import (
    DriftFigures,
    EndCase,
    SequentialTrial,
    TrialEnds,
    condition_groups,
    draw_units,
    ends_from_runs,
    run_offline,
)
from dsv4bisect.probe.sequential_plan import plan_trial, spec_cells
from dsv4bisect.probe.shards import split_batch
from dsv4bisect.probe.spec import tier_spec

PASS_DRIFT = DriftFigures("pass", "all positions", 0.0, 1.0, {"all positions": (0.0, 1.0)})
SMOKE = tier_spec("smoke")


def test_a_level_is_cut_into_windows_of_its_size() -> None:
    assert condition_groups(36, 16) == [0] * 16 + [1] * 20  # the remainder joins the last
    assert condition_groups(32, 16) == [0] * 16 + [1] * 16
    assert condition_groups(10, 16) == [0] * 10  # fewer than the level: the whole level
    assert condition_groups(3, 1) == [0, 1, 2]
    assert condition_groups(0, 4) == []
    with pytest.raises(ValueError):
        condition_groups(4, 0)


def _field_like_ends(loss_at_16: int = 28) -> TrialEnds:
    """The smoke tier as `mma-decode:batch-kv-slot` measured it (docs/reference-engine.md):
    36 cases cold at 1, the same 36 warm at 16; the bad end loses `loss_at_16` of the warm ones
    and none cold. Every answer right in the good end and its A/A repeat."""
    cases = []
    order = list(range(36))
    random.Random(7).shuffle(order)  # the level's submission order
    groups = condition_groups(36, 16)
    for i in range(36):
        family = ("needle", "copy", "vartrack")[i % 3]
        length = (256, 512, 1024, 2048)[i % 4]
        cell = f"{family}/L{length}"
        cases.append(EndCase(f"{cell}/{i}", "cold", cell, family, length, length, i,
                             True, True, True))
        p = order.index(i)
        cases.append(EndCase(f"{cell}/{i}", "warm", cell, family, length, length, i, True,
                             p >= loss_at_16, True, concurrency=16, group=groups[p], position=p))
    return TrialEnds(tuple(cases), PASS_DRIFT, 4, 4000)


def _answers(ends: TrialEnds, like: str) -> dict:
    return {c.key: (c.good_right if like == "good" else c.bad_right, ()) for c in ends.cases}


def test_units_keep_every_group_whole_and_in_its_order() -> None:
    ends = _field_like_ends()
    units, leading = draw_units(ends, seed=3)
    assert leading == 0
    groups = [u for u in units if u[0].concurrency == 16]
    assert sorted(len(u) for u in groups) == [16, 20]
    for u in groups:
        assert len({c.group for c in u}) == 1
        assert [c.position for c in u] == sorted(c.position for c in u)
    assert all(len(u) == 1 for u in units if u[0].concurrency == 1)
    assert sorted(c.key for u in units for c in u) == sorted(c.key for c in ends.cases)
    again, _ = draw_units(ends, seed=3)
    assert again == units and draw_units(ends, seed=4)[0] != units  # seeded


def test_a_concurrency_only_loss_is_seen_by_the_trial() -> None:
    ends = _field_like_ends()
    k = ends.counts()
    assert (k["n"], k["b"]) == (72, 28) and ends.accuracy_differs()
    # the losing groups carry the information: a like-bad trial fails on its first group and
    # a like-good one passes on it, whatever the seed
    for seed in range(20):
        bad = run_offline(SequentialTrial(ends, 0.01, 0.01, seed=seed), PASS_DRIFT,
                          _answers(ends, "bad"))
        good = run_offline(SequentialTrial(ends, 0.01, 0.01, seed=seed), PASS_DRIFT,
                           _answers(ends, "good"))
        assert (bad.verdict, bad.decided_by) == ("FAIL", "accuracy") and bad.losses >= 12
        assert (good.verdict, good.decided_by) == ("PASS", "accuracy")
        assert good.accuracy_requests <= 20 + 3 and bad.accuracy_requests <= 20 + 3
    # what a trial of the concurrency-1 requests alone had: nothing to tell the ends apart
    alone = TrialEnds(tuple(c for c in ends.cases if c.concurrency == 1), PASS_DRIFT, 4, 4000)
    assert not alone.accuracy_differs()


def test_a_batch_is_whole_units_until_it_holds_its_size() -> None:
    ends = _field_like_ends()
    test = SequentialTrial(ends, 1e-6, 1e-6, seed=5, batch=4)  # tight: many batches
    test.observe_drift(PASS_DRIFT)
    units_of = {}
    for c in ends.cases:
        units_of.setdefault(c.unit, set()).add(c.key)
    sent = []
    while test.decision is None:
        units = test.next_units()
        if not units:
            break
        sizes = [len(u) for u in units]
        assert sum(sizes[:-1]) < 4  # the last unit is the one that filled the batch
        for u in units:
            assert {c.key for c in u} == units_of[u[0].unit]  # never a part of a group
        for c in (c for u in units for c in u):
            sent.append(c.key)
            test.observe(c.key, True)
    assert len(sent) == len(set(sent)) == test.decision.accuracy_requests


@given(st.lists(st.integers(1, 20), min_size=1, max_size=12), st.integers(1, 4))
def test_shards_get_whole_units_in_the_batch_order(sizes, count) -> None:
    units = [tuple((u, i) for i in range(n)) for u, n in enumerate(sizes)]
    parts = split_batch(units, count)
    assert all(isinstance(u, tuple) for p in parts for u in p)
    answers = [[list(u) for u in p] for p in parts]  # each shard answers its units whole
    back = [row for k in range(len(units)) for row in answers[k % count][k // count]]
    assert back == [c for u in units for c in u]


def _cases(n: int) -> list[Case]:
    out = []
    for i in range(n):
        family = ("needle", "copy", "vartrack")[i % 3]
        length = 256 * (1 + i % 4)
        out.append(Case(f"{family}/L{length}/{i}", Cell(family, length, 0.5, 2), i, 1000 + i,
                        length, ({"role": "user", "content": f"case {i}"},), length, f"v{i}",
                        (f"v{i}",), 0.5, 16))
    return out


def _run(spec, cases: list[Case], correct) -> ProbeRun:
    rows = tuple({"case_id": c.case_id, "family": c.family, "cell": c.cell.key, "arm": arm,
                  "concurrency": level, "seed": c.seed, "length": c.cell.length,
                  "prompt_tokens": c.prompt_tokens, "correct": correct(c, arm, level),
                  "signatures": []}
                 for c, arm, level in tasks_of(spec, cases) if arm != "drift")
    return ProbeRun(spec, "http://x", {}, tuple(cases), rows)


def test_ends_carry_the_fixed_probes_submission_order_and_groups() -> None:
    spec = SMOKE.replace(concurrency=(1, 4))
    cases = _cases(10)
    base = _run(spec, cases, lambda c, arm, level: True)
    bad = _run(spec, cases, lambda c, arm, level: level == 1)
    ends = ends_from_runs(base, bad, base)
    assert {c.key for c in ends.cases} == {row_key(r) for r in base.rows}
    level = [(c.case_id, arm, lv) for c, arm, lv in tasks_of(spec, cases) if lv == 4]
    sent = [level[k] for k in submission_order(spec, 4, len(level))]
    at4 = {c.key: c for c in ends.cases if c.concurrency == 4}
    assert [at4[k].position for k in sent] == list(range(10))
    assert [at4[k].group for k in sent] == [0] * 4 + [1] * 6
    k = ends.counts()
    assert (k["n"], k["b"]) == (27, 10)  # cold and hit (7: no copy case) at 1, warm at 4
    # the hit rows pair with the ends' own and are replayed alone at 1, as the cold ones
    hit = [c for c in ends.cases if c.arm == "hit"]
    assert len(hit) == 7 and {c.concurrency for c in hit} == {1}
    assert {c.key for c in hit} == {row_key(r) for r in bad.rows if r["arm"] == "hit"}
    assert len({c.unit for c in hit}) == 7
    units, _ = draw_units(ends, seed=1)
    assert [[c.key for c in u] for u in units if u[0].concurrency == 4] in (
        [sent[:4], sent[4:]], [sent[4:], sent[:4]])


def test_a_level_row_the_spec_does_not_send_is_refused() -> None:
    spec = SMOKE.replace(concurrency=(1, 4))
    cases = _cases(6)
    base = _run(spec, cases, lambda c, arm, level: True)
    stray = {**base.rows[0], "concurrency": 8}
    odd = replace(base, rows=(*base.rows, stray))
    with pytest.raises(ConfigError, match="concurrency 8"):
        ends_from_runs(odd, odd, None)


def test_the_plan_draws_from_every_condition() -> None:
    world = spec_cells(SMOKE, 0.9)
    assert {(w.arm, w.concurrency) for w in world} == set(SMOKE.conditions())
    plan = plan_trial(SMOKE, 0.01, 0.01, loss_rate=0.3, sims=30)
    assert plan.full_requests == sum(w.cases for w in world) + 4
    assert plan.between_good == plan.between_bad == 0.0


@st.composite
def grouped_ends(draw):
    n = draw(st.integers(2, 40))
    level = draw(st.sampled_from([2, 4, 16]))
    groups = condition_groups(n, level)
    cases = []
    for i in range(n):
        good, bad = draw(st.booleans()), draw(st.booleans())
        cases.append(EndCase(f"c/{i}", "cold", "needle/L256", "needle", 256, 256, i, good,
                             good, good))
        cases.append(EndCase(f"c/{i}", "warm", "needle/L256", "needle", 256, 256, i, good,
                             bad, good, concurrency=level, group=groups[i], position=i))
    ans = {c.key: (draw(st.booleans()), ()) for c in cases}
    return TrialEnds(tuple(cases), PASS_DRIFT, 1, 100), ans, draw(st.integers(1, 9))


@settings(max_examples=100, deadline=None)
@given(grouped_ends(), st.integers(0, 2**16))
def test_a_decision_counts_whole_groups(example, seed: int) -> None:
    ends, ans, batch = example
    test = SequentialTrial(ends, 0.05, 0.05, seed=seed, batch=batch)
    d = run_offline(test, PASS_DRIFT, ans)
    units, _ = draw_units(ends, seed)
    done = [sum(len(u) for u in units[:i]) for i in range(len(units) + 1)]
    assert d.accuracy_requests in done  # a decision never falls inside a group
    assert d.cap == len(ends.cases) or not ends.accuracy_differs()
    assert run_offline(SequentialTrial(ends, 0.05, 0.05, seed=seed, batch=batch), PASS_DRIFT,
                       ans) == d
