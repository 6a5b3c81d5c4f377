"""The verdict rule on synthetic runs: each branch of DESIGN §6 / probe-anchors §6.4."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.drift import DriftRecord
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import judge
from dsv4bisect.probe.scoring import score
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.verdict import Verdict

SPEC = tier_spec("smoke")


def rows(n: int, correct: Callable[[int], bool], *, cells: int = 4, family: str = "needle",
         sigs: Callable[[int], list[str]] = lambda i: []) -> list[dict]:
    return [{"case_id": f"{family}/c{i % cells}/{i}", "family": family,
             "cell": f"{family}/c{i % cells}",
             "arm": "cold", "seed": 1000 + i, "correct": correct(i), "signatures": sigs(i),
             "prompt_tokens": 100, "length": 512, "depth": 0.5, "turns": 4}
            for i in range(n)]


def drift(case: str, shift: float) -> DriftRecord:
    # Three positions; `shift` moves probability from token 7 to token 8 at the last position.
    base = ((7, math.log(0.9)), (8, math.log(0.05)))
    moved = ((7, math.log(0.9 - shift)), (8, math.log(0.05 + shift)))
    moved = tuple(sorted(moved, key=lambda t: -t[1]))
    return DriftRecord(case, (0, 1, 2, 3), 1, (1, 2, 3), (-0.1, -0.1, -0.1),
                       (base, base, moved if shift else base))


def run(rs: list[dict], drifts: tuple[DriftRecord, ...] = (), spec=SPEC) -> ProbeRun:
    return ProbeRun(spec, "http://x", {}, (), tuple(rs), drifts)


def test_identical_good_runs_pass_and_state_their_power() -> None:
    base = run(rows(40, lambda i: True))
    v = judge(base, base, base)
    assert v.verdict == "PASS" and v.exit_code == 0
    assert v.families["needle"].baseline_accuracy == 1.0 and v.families["needle"].evidence
    assert v.power["n_baseline_right"] == 40 and 0 < v.power["min_detectable_drop"] < 0.3
    assert v.power["zero_loss_bound"] == pytest.approx(1 - 0.05 ** (1 / 40))
    assert "detects with 95 % probability" in v.reasons[0]


def test_significant_loss_fails_overall() -> None:
    base = run(rows(40, lambda i: True))
    cand = run(rows(40, lambda i: i % 5 != 0))  # 8 lost
    v = judge(base, base, cand)
    assert v.verdict == "FAIL" and v.exit_code == 1
    assert v.overall["b"] == 8 and v.overall["c"] == 0 and v.overall["p_value"] == 2**-8
    assert any("exact McNemar" in r for r in v.reasons)


def test_small_loss_is_not_significant() -> None:
    base = run(rows(40, lambda i: True))
    cand = run(rows(40, lambda i: i not in (3, 17)))
    v = judge(base, base, cand)
    assert v.verdict == "PASS" and v.overall["b"] == 2


def test_a_loss_confined_to_one_cell_fails_by_holm() -> None:
    # Cell c0 loses all 10; cells c1..c3 gain 6, so the pooled test does not fire.
    base = run(rows(40, lambda i: i not in (1, 2, 3, 5, 6, 7)))
    cand = run(rows(40, lambda i: i % 4 != 0))
    v = judge(base, base, cand)
    assert v.overall["b"] == 10 and v.overall["c"] == 6 and v.overall["p_value"] > 0.01
    failed = [c for c in v.cells if c.failed]
    assert v.verdict == "FAIL" and [c.cell for c in failed] == ["needle/c0"]
    assert failed[0].p_holm == pytest.approx(4 * 2**-10)


def test_hard_signatures_in_two_seeds_fail_at_once() -> None:
    base = run(rows(40, lambda i: True))
    cand = run(rows(40, lambda i: i not in (4, 9),
                    sigs=lambda i: ["wrong_last_char"] if i in (4, 9) else []))
    v = judge(base, base, cand)
    assert v.verdict == "FAIL" and v.signatures["hard_fail"]
    assert v.signatures["candidate"] == {"wrong_last_char": [1004, 1009]}
    one = run(rows(40, lambda i: i != 4, sigs=lambda i: ["garbage"] if i == 4 else []))
    assert judge(base, base, one).verdict == "PASS"


def test_answers_cut_by_a_false_eos_in_two_seeds_fail() -> None:
    # The scorer's `truncated` signature reaches the rule: a speculation fault that ends two
    # answers inside their values (finish reason stop) FAILs, one such answer does not.
    def cut(i: int) -> list[str]:
        return list(score("24492", "2449273", ("2449273",), "stop").signatures)
    base = run(rows(40, lambda i: True))
    cand = run(rows(40, lambda i: i not in (4, 9), sigs=lambda i: cut(i) if i in (4, 9) else []))
    v = judge(base, base, cand)
    assert v.verdict == "FAIL" and v.signatures["candidate"] == {"truncated": [1004, 1009]}
    assert any(r.startswith("hard signatures") and "truncated" in r for r in v.reasons)
    one = run(rows(40, lambda i: i != 4, sigs=lambda i: cut(i) if i == 4 else []))
    assert judge(base, base, one).verdict == "PASS"


def test_signatures_where_the_baseline_was_wrong_do_not_count() -> None:
    base = run(rows(40, lambda i: i >= 10))
    cand = run(rows(40, lambda i: i >= 10, sigs=lambda i: ["empty"] if i < 10 else []))
    assert judge(base, base, cand).verdict == "PASS"


def test_no_retrieval_means_no_evidence_and_drift_decides() -> None:
    dead = rows(20, lambda i: False)
    base = run(dead, (drift("d0", 0.0), drift("d1", 0.0)))
    same = judge(base, base, base)
    assert same.verdict == "PASS"
    assert any("no evidence" in r and "drift decides" in r for r in same.reasons)
    assert not same.families["needle"].evidence and same.drift["status"] == "pass"
    broken = run(dead, (drift("d0", 0.6), drift("d1", 0.6)))
    v = judge(base, base, broken)  # drift alone never FAILs: no fact was lost
    assert v.verdict == "WARN" and v.drift["status"] == "warn" and v.exit_code == 4
    assert v.drift["candidate"]["first_divergence"] == 3 and v.drift["null"] is None
    assert any("no null model was measured" in r for r in v.reasons)
    slight = run(dead, (drift("d0", 0.06), drift("d1", 0.06)))
    w = judge(base, base, slight)
    assert w.verdict == "WARN" and w.exit_code == 4, w.drift


def test_nothing_to_judge_cannot_test() -> None:
    base = run(rows(20, lambda i: False))
    v = judge(base, base, base)
    assert v.verdict == "CANNOT_TEST" and v.exit_code == 125
    assert v.reasons[0].startswith("no evidence")


def test_lopsided_aa_cannot_test() -> None:
    base = run(rows(40, lambda i: True))
    rep = run(rows(40, lambda i: i >= 12))
    v = judge(base, rep, base)
    assert v.verdict == "CANNOT_TEST" and "repeat" in v.reasons[0]


def test_missing_repeat_is_said() -> None:
    base = run(rows(40, lambda i: True))
    v = judge(base, None, base)
    assert v.verdict == "PASS" and any("no A/A repeat" in r for r in v.reasons)


def test_runs_with_different_specs_are_refused() -> None:
    a = run(rows(4, lambda i: True))
    b = run(rows(4, lambda i: True), spec=SPEC.replace(seed_block=2))
    with pytest.raises(ConfigError, match="different probe specs"):
        judge(a, a, b)


def test_verdict_json_round_trip() -> None:
    base = run(rows(40, lambda i: True))
    v = judge(base, base, run(rows(40, lambda i: i % 5 != 0))).with_evidence(candidate="/tmp/c")
    data = json.loads(json.dumps(v.to_dict()))
    assert data["verdict"] == "FAIL" and data["families"]["needle"]["candidate_accuracy"] == 0.8
    assert data["evidence"]["candidate"] == "/tmp/c"
    assert Verdict.from_dict(data) == v


def test_a_fault_confined_to_long_context_warns_by_its_position_bucket() -> None:
    # 2000 scored positions; the candidate flips the argmax at 6 % of positions >= 1024 only:
    # 2.9 % overall but 6 % in the 1024-2047 bucket, the clearer view.
    n = 2000
    same = ((7, math.log(0.6)), (8, math.log(0.3)))
    flipped = ((8, math.log(0.6)), (7, math.log(0.3)))
    ids = tuple(range(n + 1))
    tops_b = (same,) * n
    tops_c = tuple(flipped if p >= 1024 and p % 17 == 0 else same for p in range(1, n + 1))
    lps = (-0.5,) * n
    rec_b = DriftRecord("d", ids, 1, tuple(range(1, n + 1)), lps, tops_b)
    rec_c = DriftRecord("d", ids, 1, tuple(range(1, n + 1)), lps, tops_c)
    dead = rows(8, lambda i: False)
    v = judge(run(dead, (rec_b,)), run(dead, (rec_b,)), run(dead, (rec_c,)))
    assert v.verdict == "WARN" and v.drift["trigger"]["where"] == "positions 1024-2047"
    assert v.drift["candidate"]["top1_agreement"] > 0.97
    assert v.drift["candidate"]["by_position"]["1024-2047"]["top1_agreement"] < 0.95


def test_repeat_accuracy_is_null_without_a_repeat() -> None:
    base = run(rows(10, lambda i: i < 8))
    assert judge(base, None, base).families["needle"].repeat_accuracy is None
    assert judge(base, base, base).families["needle"].repeat_accuracy == 0.8
