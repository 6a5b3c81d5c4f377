"""The null model: drift judged as a multiple of the good end's own variation (probe/null.py)."""

from __future__ import annotations

import math
import random

from dsv4bisect.probe import null
from dsv4bisect.probe.drift import DriftRecord, compare
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import judge
from dsv4bisect.probe.spec import tier_spec

SPEC = tier_spec("smoke")
N = 600  # scored positions per transcript


def record(case: str, rng: random.Random | None, sigma: float) -> DriftRecord:
    """A transcript whose top-2 at each position is (0.6, 0.3), moved by N(0, sigma) when an
    rng is given: a numeric change of that size."""
    tops = []
    for _ in range(N):
        e = rng.gauss(0.0, sigma) if rng else 0.0
        e = max(-0.25, min(0.25, e))
        top = ((7, math.log(0.6 + e)), (8, math.log(0.3 - e)))
        tops.append(tuple(sorted(top, key=lambda t: -t[1])))
    return DriftRecord(case, tuple(range(N + 1)), 1, tuple(range(1, N + 1)), (-0.5,) * N,
                       tuple(tops))


def base_with_null(sigma: float, seed: int = 1) -> ProbeRun:
    rng = random.Random(seed)
    cold = tuple(record(f"d{i}", None, 0.0) for i in range(4))
    arms = tuple((arm, record(f"d{i}", rng, sigma)) for arm in null.NULL_ARMS for i in range(4))
    return ProbeRun(SPEC, "http://x", {}, (), (), cold, null=arms)


def cand(sigma: float, seed: int) -> ProbeRun:
    rng = random.Random(seed)
    return ProbeRun(SPEC, "http://x", {}, (), (), tuple(record(f"d{i}", rng, sigma)
                                                        for i in range(4)))


def test_drift_is_a_multiple_of_the_null_and_only_warns() -> None:
    base = base_with_null(0.01)
    like = judge(base, None, cand(0.01, seed=7))
    assert like.verdict == "PASS" and like.drift["status"] == "pass"
    assert 0.5 < like.drift["multiple"] < 2.0
    worse = judge(base, None, cand(0.05, seed=7))  # 25× the null's KL: a WARN, never a FAIL
    assert worse.verdict == "WARN" and worse.exit_code == 4
    assert 15 < worse.drift["multiple"] < 40
    assert any("the deployment's own variation" in r for r in worse.reasons)
    view = worse.drift["null"]["views"]["all positions"]
    assert view["kl_mean_ci"][0] < view["kl_mean"] < view["kl_mean_ci"][1]
    assert 1.0 < view["warn_multiple"] < 3.0  # 2400 positions: the mean is well determined


def test_false_alarm_rate_holds_on_the_null_itself() -> None:
    # Candidates drawn from the null's own distribution WARN at about FALSE_ALARM, not more.
    base = base_with_null(0.01)
    comps = null.null_comparisons(base.drift, base.null)
    model = null.build(comps, {null.ALL: 4 * N})
    assert model is not None and model.tests == 3
    view = model.views[null.ALL]
    warns = 0
    for seed in range(100):
        c = [compare(ref, rec) for ref, rec in zip(base.drift, cand(0.01, seed + 100).drift)]
        kl = [k for x in c for k in x.kl]
        same = [s for x in c for s in x.top1_same]
        warns += null.judge_view(view, kl, same)["status"] == "warn"
    assert warns <= 4  # expected 1 of 100 at 1 %; P(Bin(100, 0.01) >= 5) = 0.003


def test_an_exact_zero_null_warns_on_any_drift() -> None:
    base = base_with_null(0.0)
    assert judge(base, None, cand(0.0, 1)).verdict == "PASS"
    v = judge(base, None, cand(0.001, 1))
    assert v.verdict == "WARN" and v.drift["multiple"] is None
    assert any("exactly 0" in r for r in v.reasons)


def test_the_null_is_kept_with_the_run(tmp_path) -> None:
    base = base_with_null(0.01).save(tmp_path / "b")
    back = ProbeRun.load(tmp_path / "b")
    assert [a for a, _ in back.null] == [a for a, _ in base.null] and back.null == base.null
