"""Serving conditions of the probe: arms × concurrency levels, the seeded submission order, the
pairing key (case, arm, level), and the conditions and throughput every verdict states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.conditions import family_conditions, throughput_lines
from dsv4bisect.probe.grid import Case, Cell
from dsv4bisect.probe.run import ProbeRun, row_key
from dsv4bisect.probe.runner import judge
from dsv4bisect.probe.tasks import submission_order, tasks_of
from dsv4bisect.probe.sequential import ends_from_runs
from dsv4bisect.probe.spec import ProbeSpec, tier_spec, with_concurrency
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.report.run_report import _load_verdict

SMOKE = tier_spec("smoke")


def test_staggered_tiers_run_cold_alone_and_warm_among_others() -> None:
    # smoke: each cold request is sent again at 1 (hit), warm at 16
    assert SMOKE.conditions() == (("cold", 1), ("hit", 1), ("warm", 16))
    assert tier_spec("standard").conditions() == (("cold", 1), ("warm", 16))
    two = SMOKE.replace(arms=("cold", "warm"))
    three = two.replace(concurrency=(1, 4, 16))
    assert three.conditions() == (("cold", 1), ("warm", 4), ("warm", 16))
    assert SMOKE.replace(concurrency=(1, 4, 16)).conditions() == (
        ("cold", 1), ("warm", 4), ("hit", 16))
    assert two.replace(concurrency=(1,)).conditions() == (("cold", 1), ("warm", 1))
    assert SMOKE.replace(concurrency=(1,)).conditions() == (
        ("cold", 1), ("warm", 1), ("hit", 1))
    assert SMOKE.replace(arms=("cold",)).conditions() == (("cold", 1), ("cold", 16))
    assert SMOKE.replace(arms=("cold", "hit")).conditions() == (("cold", 1), ("hit", 16))
    deep = tier_spec("deep").replace(concurrency=(1, 32))
    assert deep.conditions() == (("cold", 1), ("warm", 1), ("cold", 32), ("warm", 32))


def test_every_multi_turn_case_of_smoke_and_standard_runs_warm() -> None:
    for tier in ("smoke", "standard"):
        spec = tier_spec(tier)
        assert all(t > 1 for t in spec.turns)
        assert any(arm == "warm" for arm, _ in spec.conditions())


@pytest.mark.parametrize("bad", [dict(concurrency=()), dict(concurrency=(16, 1)),
                                 dict(concurrency=(1, 1)), dict(concurrency=(0,)),
                                 dict(arm_plan="sometimes")])
def test_bad_conditions_are_refused(bad: dict) -> None:
    with pytest.raises(ConfigError):
        SMOKE.replace(**bad)


def test_spec_hash_keeps_its_value_without_conditions_and_moves_with_them() -> None:
    ci = tier_spec("ci")
    assert "concurrency" not in ci.canonical() and "arm_plan" not in ci.canonical()
    assert ci.replace(concurrency=(1, 16)).spec_hash() != ci.spec_hash()
    assert SMOKE.replace(concurrency=(1, 32)).spec_hash() != SMOKE.spec_hash()
    again = ProbeSpec.from_dict(json.loads(json.dumps(SMOKE.to_dict())))
    assert again == SMOKE and again.spec_hash() == SMOKE.spec_hash()


def test_the_tests_tier_keeps_one_level() -> None:
    assert with_concurrency(tier_spec("ci"), (1, 16)).concurrency == (1,)
    assert with_concurrency(SMOKE, (1, 32)).concurrency == (1, 32)
    assert with_concurrency(SMOKE, None) is SMOKE


def test_submission_order_is_a_seeded_permutation_shared_by_every_run() -> None:
    order = submission_order(SMOKE, 16, 36)
    assert sorted(order) == list(range(36)) and order != list(range(36))
    assert submission_order(SMOKE, 16, 36) == order  # baseline, repeat, candidate alike
    assert submission_order(SMOKE.replace(seed_block=1), 16, 36) != order
    assert submission_order(SMOKE.replace(seed=5), 16, 36) != order
    assert submission_order(SMOKE, 4, 36) != order
    assert submission_order(SMOKE, 1, 36) == list(range(36))  # one at a time: the grid's order


def _case(family: str, i: int) -> Case:
    cell = Cell(family, 256, 0.5, 3)
    return Case(f"{cell.key}/{i}", cell, i, 100 + i, 256, ({"role": "user", "content": "x"},),
                256, "1234567", ("1234567",), 0.5, 9)


def test_tasks_cover_each_case_once_per_condition() -> None:
    spec = SMOKE.replace(thinking=True)
    cases = [_case("needle", 0), _case("copy", 1), _case("drift", 2)]
    tasks = tasks_of(spec, cases)
    acc = [(c.case_id, arm, level) for c, arm, level in tasks if arm in spec.arms]
    # a case's hit request right after its cold one (the retry finds the prompt cached)
    assert acc == [("needle/L256/d0.5/t3/0", "cold", 1), ("needle/L256/d0.5/t3/0", "hit", 1),
                   ("copy/L256/d0.5/t3/1", "cold", 1),  # the hit arm asks no copy case
                   ("needle/L256/d0.5/t3/0", "warm", 16), ("copy/L256/d0.5/t3/1", "warm", 16)]
    assert [(c.family, level) for c, arm, level in tasks if arm == "think"] == [("needle", 1)]
    assert [(c.family, level) for c, arm, level in tasks if arm == "drift"] == [("drift", 1)]


def test_the_hit_arm_asks_only_its_families() -> None:
    tasks = tasks_of(SMOKE, [_case("copy", 0), _case("vartrack", 1)])
    assert [(c.case_id, arm) for c, arm, level in tasks if level == 1] == [
        ("copy/L256/d0.5/t3/0", "cold"), ("vartrack/L256/d0.5/t3/1", "cold"),
        ("vartrack/L256/d0.5/t3/1", "hit")]
    assert len(tasks_of(SMOKE.replace(hit_families=()), [_case("copy", 0)])) == 3  # every case
    with pytest.raises(ConfigError, match="hit_families"):
        SMOKE.replace(hit_families=("drift",))


def _rows(correct_at: dict[int, bool]) -> list[dict]:
    """Ten needle cases at two conditions: cold@1 and warm@16."""
    out = []
    for level, arm in ((1, "cold"), (16, "warm")):
        for i in range(10):
            out.append({"case_id": f"needle/c/{i}", "family": "needle", "cell": "needle/c",
                        "arm": arm, "concurrency": level, "seed": 1000 + i,
                        "correct": correct_at[level], "signatures": [], "prompt_tokens": 100,
                        "completion_tokens": 8, "length": 512, "depth": 0.5, "turns": 3})
    return out


TP = {"1": {"requests": 10, "tokens": 1080, "wall_s": 5.0, "requests_per_s": 2.0,
            "tokens_per_s": 216.0, "arms": ["cold"]},
      "16": {"requests": 10, "tokens": 1080, "wall_s": 2.0, "requests_per_s": 5.0,
             "tokens_per_s": 540.0, "arms": ["warm"]}}


def _run(rows: list[dict]) -> ProbeRun:
    return ProbeRun(SMOKE, "http://x", {}, (), tuple(rows), throughput=TP)


def test_rows_pair_by_case_arm_and_level() -> None:
    rows = _rows({1: True, 16: True})
    assert len({row_key(r) for r in rows}) == 20
    assert row_key({"case_id": "a", "arm": "cold"}) == ("a", "cold", 1)  # older rows: level 1


def test_a_loss_under_concurrency_alone_is_caught_and_located() -> None:
    base = _run(_rows({1: True, 16: True}))
    cand = _run(_rows({1: True, 16: False}))  # the candidate loses every answer at 16 only
    v = judge(base, base, cand)
    assert v.verdict == "FAIL" and v.overall["b"] == 10 and v.overall["n"] == 20
    cells = {(c.arm, c.concurrency): c for c in v.cells}
    assert cells[("warm", 16)].b == 10 and cells[("cold", 1)].b == 0
    assert any("concurrency 16" in r for r in v.reasons)


def test_verdict_states_conditions_and_throughput_in_every_form(tmp_path: Path) -> None:
    base = _run(_rows({1: True, 16: True}))
    v = judge(base, base, base)
    assert v.conditions["needle"] == {"arms": ["cold", "warm"], "concurrency": [1, 16],
                                      "requests": {"cold@1": 10, "warm@16": 10}}
    assert family_conditions(v.conditions["needle"]) == "cold@1 ×10, warm@16 ×10"
    assert v.throughput["candidate"]["16"]["requests_per_s"] == 5.0
    lines = throughput_lines(v.throughput)
    assert "candidate at concurrency 16: 5 requests/s, 540 tokens/s (10 requests, warm, 2.0 s)" \
        in lines and len(lines) == 4
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(v.to_dict()))
    again = _load_verdict(path)  # the report's reader, with its shape checks
    assert again.conditions == v.conditions and again.throughput == v.throughput
    assert Verdict.from_dict({**v.to_dict(), "conditions": {}}).conditions == {}


def test_throughput_is_saved_with_the_run(tmp_path: Path) -> None:
    _run(_rows({1: True, 16: True})).save(tmp_path / "r")
    assert ProbeRun.load(tmp_path / "r").throughput == TP


def test_sequential_trial_ends_hold_every_condition_with_its_group() -> None:
    base = _run(_rows({1: True, 16: True}))
    bad = _run(_rows({1: False, 16: False}))
    ends = ends_from_runs(base, bad, None)
    assert len(ends.cases) == 20
    assert {c.condition for c in ends.cases} == {("cold", 1), ("warm", 16)}
    cold = [c for c in ends.cases if c.concurrency == 1]
    warm = [c for c in ends.cases if c.concurrency == 16]
    assert len({c.unit for c in cold}) == 10  # each alone
    # a run without its cases keeps its rows' order: 10 requests, one group of the level
    assert {c.unit for c in warm} == {("group", 16, 0)}
    assert [c.position for c in warm] == list(range(10))
    assert {c.key for c in ends.cases} == {row_key(r) for r in base.rows}


def test_a_level_clones_the_client_with_its_own_deadline() -> None:
    from dsv4bisect.probe.client import ProbeClient

    client = ProbeClient("http://127.0.0.1:9", api_key="k", timeout_s=60, retries=3, model="m")
    twin = client.clone(timeout_s=60 * 16)
    assert (twin.url, twin.model, twin.retries, twin.timeout_s) == (client.url, "m", 3, 960)
    assert twin._session is not client._session
    assert client.clone().timeout_s == 60
    client.close()
    twin.close()


def test_a_verdict_says_where_the_answers_ran_through_speculative_decoding(tmp_path: Path) -> None:
    spec_info = {"info": {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3,
                          "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}}
    base = _run(_rows({1: True, 16: True}))
    cand = ProbeRun(SMOKE, "http://x", spec_info, (), tuple(_rows({1: True, 16: True})),
                    throughput=TP)
    v = judge(base, base, cand)
    assert v.throughput["decoding"] == {
        "baseline": "greedy",
        "candidate": "greedy, speculative NEXTN (3 steps, top-k 1, 4 draft tokens)"}
    lines = throughput_lines(v.throughput)
    assert lines[:2] == ["baseline decoded greedy",
                         ("candidate decoded greedy, speculative NEXTN (3 steps, top-k 1, 4 "
                          "draft tokens)")]
    assert len(throughput_lines(judge(base, base, base).throughput)) == 4  # none: not said
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(v.to_dict()))
    assert _load_verdict(path).throughput == v.throughput
