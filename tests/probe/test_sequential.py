"""The sequential trial test on hand-made ends: each rule, the draw order, and the invariants
of every decision (property tests over random ends and answers)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.policy import DriftRule, TrialPolicy, WarnAs
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.sequential import (
    DriftFigures,
    EndCase,
    SequentialTrial,
    TrialEnds,
    draw_units,
    ends_from_runs,
    run_offline,
    wald_thresholds,
)
from dsv4bisect.probe.sequential_plan import plan_trial
from dsv4bisect.probe.spec import tier_spec

WARN_PASSES = TrialPolicy(warn_as=WarnAs.PASS)  # `--warn-as pass`
RELATIVE = TrialPolicy(drift=DriftRule.RELATIVE)  # `--drift relative`

PASS_DRIFT = DriftFigures("pass", "all positions", 0.0, 1.0, {"all positions": (0.0, 1.0)})
FAIL_DRIFT = DriftFigures("fail", "all positions", 0.15, 0.31, {"all positions": (0.15, 0.31)})


def make_ends(n_cells: int = 8, per_cell: int = 7, lost_lengths: tuple[int, ...] = (65536,),
              loss_every: int = 2, bad_drift: DriftFigures = PASS_DRIFT,
              good_wrong_every: int = 0) -> TrialEnds:
    """Cells at lengths 4096 and 65536 alternately; the bad end loses every `loss_every`-th
    case in cells of `lost_lengths` (0: none)."""
    cases = []
    for c in range(n_cells):
        length = 65536 if c % 2 else 4096
        for i in range(per_cell):
            good = not (good_wrong_every and i % good_wrong_every == 0)
            lost = bool(loss_every) and length in lost_lengths and i % loss_every == 0
            cases.append(EndCase(f"needle/L{length}/c{c}/{i}", "cold", f"needle/L{length}/c{c}",
                                 "needle", length, length, 1000 * c + i, good,
                                 good and not lost, good))
    return TrialEnds(tuple(cases), bad_drift, 2, 8192)


def draw_order(ends: TrialEnds, seed: int) -> list[EndCase]:
    """Every accuracy case in the order `draw_units` sends them."""
    return [c for unit in draw_units(ends, seed)[0] for c in unit]


def answers(ends: TrialEnds, like: str) -> dict:
    return {c.key: ((c.good_right if like == "good" else c.bad_right), ()) for c in ends.cases}


def test_wald_thresholds() -> None:
    lo, hi = wald_thresholds(0.05, 0.05)
    assert lo == pytest.approx(math.log(0.05 / 0.95)) and hi == pytest.approx(math.log(19))
    with pytest.raises(ValueError):
        wald_thresholds(0.0, 0.05)


def test_like_good_passes_and_like_bad_fails_early() -> None:
    ends = make_ends()
    good = run_offline(SequentialTrial(ends, 0.05, 0.05), PASS_DRIFT, answers(ends, "good"))
    bad = run_offline(SequentialTrial(ends, 0.05, 0.05), PASS_DRIFT, answers(ends, "bad"))
    assert good.verdict == "PASS" and good.decided_by == "accuracy"
    assert bad.verdict == "FAIL" and bad.decided_by == "accuracy" and bad.losses >= 1
    for d in (good, bad):
        assert d.accuracy_requests < d.cap == len(ends.cases)
        assert d.requests == d.accuracy_requests + 2 and (d.false_fail, d.false_pass) == (
            0.05, 0.05)
    assert good.log_lr <= good.thresholds[0] and bad.log_lr >= bad.thresholds[1]


def test_fault_at_the_longest_length_is_looked_for_there_first() -> None:
    ends = make_ends(n_cells=16)
    order = draw_order(ends, seed=3)
    assert sorted(c.key for c in order) == sorted(c.key for c in ends.cases)
    first = order[:16]
    assert sum(c.length == 65536 for c in first) >= 14  # weighted toward where the ends differ
    assert draw_order(ends, seed=3) == order and draw_order(ends, seed=4) != order
    # A trial that only looks like the good end at short lengths is not passed on them.
    short_only = {c.key: (c.good_right if c.length == 4096 else c.bad_right, ())
                  for c in ends.cases}
    d = run_offline(SequentialTrial(ends, 0.05, 0.05, seed=3), PASS_DRIFT, short_only)
    assert d.verdict == "FAIL"


def test_drift_fail_fails_before_any_accuracy_request() -> None:
    ends = make_ends()
    d = SequentialTrial(ends, 0.05, 0.05).observe_drift(FAIL_DRIFT)
    assert d is not None and d.verdict == "FAIL" and d.decided_by == "drift"
    assert d.accuracy_requests == 0 and d.requests == 2


def test_drift_only_ends_are_decided_by_drift() -> None:
    ends = make_ends(loss_every=0, bad_drift=FAIL_DRIFT)
    assert not ends.accuracy_differs()
    like_good = SequentialTrial(ends, 0.05, 0.05).observe_drift(PASS_DRIFT)
    assert like_good is not None and like_good.verdict == "PASS"
    assert like_good.decided_by == "drift" and like_good.accuracy_requests == 0
    warn = DriftFigures("warn", "all positions", 0.004, 0.9, {"all positions": (0.004, 0.9)})
    warn_ends = make_ends(loss_every=0, bad_drift=warn)
    similar = DriftFigures("warn", "all positions", 0.003, 0.93, {"all positions": (0.003, 0.93)})
    d = SequentialTrial(warn_ends, 0.05, 0.05).observe_drift(similar)
    assert d is not None and d.verdict == "FAIL" and d.decided_by == "drift"
    slight = DriftFigures("warn", "all positions", 0.0011, 0.99, {"all positions": (0.0011, 0.99)})
    d = SequentialTrial(warn_ends, 0.05, 0.05).observe_drift(slight)
    assert d is not None and d.verdict == "BETWEEN"  # neither end's drift: never a pass
    # --warn-as pass: a WARN counts as PASS, as in the full probe; a drift FAIL still fails
    fail_ends = make_ends(loss_every=0, bad_drift=FAIL_DRIFT)
    d = SequentialTrial(fail_ends, 0.05, 0.05, policy=WARN_PASSES).observe_drift(similar)
    assert d is not None and d.verdict == "PASS"
    d = SequentialTrial(fail_ends, 0.05, 0.05, policy=WARN_PASSES).observe_drift(FAIL_DRIFT)
    assert d is not None and d.verdict == "FAIL"


def test_relative_drift_judges_a_trial_by_the_nearer_end() -> None:
    # a W4A4 baseline: every kernel change fails the run gates; the fault drifts five times more
    bad = DriftFigures("fail", "all positions", 0.9, 0.82, {"all positions": (0.9, 0.82)})
    benign = DriftFigures("fail", "all positions", 0.16, 0.93, {"all positions": (0.16, 0.93)})
    fault = DriftFigures("fail", "all positions", 0.7, 0.84, {"all positions": (0.7, 0.84)})
    drift_only = make_ends(loss_every=0, bad_drift=bad)
    assert SequentialTrial(drift_only, 0.05, 0.05).observe_drift(benign).verdict == "FAIL"
    d = SequentialTrial(drift_only, 0.05, 0.05, policy=RELATIVE).observe_drift(benign)
    assert d is not None and d.verdict == "PASS"
    assert any("nearer the good end" in r for r in d.reasons)
    d = SequentialTrial(drift_only, 0.05, 0.05, policy=RELATIVE).observe_drift(fault)
    assert d is not None and d.verdict == "FAIL"  # 78 % of the bad end's: like it
    # measured at deployment (bisect of reference-all + double-scale, positions 1024-2047): the
    # bad end without the fault has a third of its KL but half its top-1 shortfall, because
    # near-tied positions flip under any change; the mean KL is what adds up
    bad_end = DriftFigures("fail", "all positions", 0.828, 0.828, {"all positions": (0.828, 0.828)})
    rest = DriftFigures("fail", "all positions", 0.275, 0.909, {"all positions": (0.275, 0.909)})
    assert rest.share_of(bad_end) > 0.5 > rest.share_of(bad_end, kl_only=True)
    d = SequentialTrial(make_ends(loss_every=0, bad_drift=bad_end), 0.05, 0.05,
                        policy=RELATIVE).observe_drift(rest)
    assert d is not None and d.verdict == "PASS"
    # ends that differ in accuracy: a benign drift FAIL no longer decides, the answers do
    lossy = make_ends(bad_drift=bad)
    test = SequentialTrial(lossy, 0.05, 0.05, policy=RELATIVE)
    assert test.observe_drift(benign) is None
    right = {c.key: (c.good_right, ()) for c in lossy.cases}  # answers like the good end's
    d = run_offline(SequentialTrial(lossy, 0.05, 0.05, policy=RELATIVE), benign, right)
    assert d.verdict == "PASS" and d.decided_by == "accuracy"
    wrong = {c.key: (c.bad_right, ()) for c in lossy.cases}  # ... like the bad end's
    d = run_offline(SequentialTrial(lossy, 0.05, 0.05, policy=RELATIVE), benign, wrong)
    assert d.verdict == "FAIL" and d.decided_by == "accuracy"


def test_ends_that_do_not_differ_give_between() -> None:
    d = SequentialTrial(make_ends(loss_every=0), 0.05, 0.05).observe_drift(PASS_DRIFT)
    assert d is not None and d.verdict == "BETWEEN" and d.decided_by == "ends"


@pytest.mark.parametrize("sig", ["wrong_last_char", "truncated"])
def test_hard_signatures_in_two_seeds_fail(sig: str) -> None:
    ends = make_ends()
    ans = {k: (True, ()) for k in answers(ends, "good")}
    for c in ends.cases[:2]:
        ans[c.key] = (False, (sig,))
    test = SequentialTrial(ends, 0.01, 0.01, batch=len(ends.cases))
    d = run_offline(test, PASS_DRIFT, ans)
    assert d.verdict == "FAIL" and d.decided_by == "signatures"
    assert sig in d.reasons[0]


def test_signature_only_ends_ask_the_signature_cases_alone() -> None:
    base = make_ends(loss_every=0)
    sig = [EndCase(c.case_id, c.arm, c.cell, c.family, c.length, c.prompt_tokens, c.seed,
                   c.good_right, c.bad_right, c.repeat_right,
                   bad_signatures=("garbage",) if i in (3, 20, 40) else ())
           for i, c in enumerate(base.cases)]
    ends = TrialEnds(tuple(sig), PASS_DRIFT, 2, 8192)
    assert not ends.accuracy_differs() and len(ends.bad_signature_cases()) == 3
    fresh = run_offline(SequentialTrial(ends, 0.05, 0.05), PASS_DRIFT, answers(ends, "good"))
    # The bad end failed on its signatures alone; none of them comes back: like the good end.
    assert fresh.verdict == "PASS" and fresh.decided_by == "signatures"
    assert fresh.accuracy_requests == fresh.cap == 3
    ans = answers(ends, "good") | {c.key: (True, ("garbage",))
                                   for c in ends.bad_signature_cases()}
    d = run_offline(SequentialTrial(ends, 0.05, 0.05, batch=3), PASS_DRIFT, ans)
    assert d.verdict == "FAIL" and d.decided_by == "signatures" and d.accuracy_requests == 3


WARN_DRIFT = DriftFigures("warn", "positions 0-255", 0.19, 0.93,
                          {"positions 0-255": (0.19, 0.93)})


def signature_ends(seeds_with_signature: int) -> TrialEnds:
    """As a bisect of `nextn-speculation:draft-eos` among bf16 patches measured them: the bad
    end drifts (WARN) and cut 3 of 29 answers (too few for the ends to differ in accuracy at
    the trial's size), each a `truncated` hard signature in its own seed."""
    base = make_ends(loss_every=0, bad_drift=WARN_DRIFT)
    cut = set(range(seeds_with_signature))
    cases = tuple(EndCase(c.case_id, c.arm, c.cell, c.family, c.length, c.prompt_tokens, c.seed,
                          c.good_right, c.good_right and i not in cut, c.repeat_right,
                          bad_signatures=("truncated",) if i in cut else ())
                  for i, c in enumerate(base.cases))
    return TrialEnds(cases, WARN_DRIFT, 2, 8192)


def test_a_bad_end_that_lost_facts_as_signatures_is_bisected_on_them_not_on_drift() -> None:
    ends = signature_ends(3)
    assert not ends.accuracy_differs()
    sig_cases = {c.key for c in ends.bad_signature_cases()}
    # A trial with the bf16 patches but not the fault drifts as far as the bad end: drift does
    # not decide; it answers the three signature cases cleanly and is like the good end.
    clean = run_offline(SequentialTrial(ends, 0.01, 0.01), WARN_DRIFT, answers(ends, "good"))
    assert clean.verdict == "PASS" and clean.decided_by == "signatures"
    assert clean.accuracy_requests == 3
    # With the fault (and any drift): the cases come back cut in two seeds or more: FAIL.
    cut = answers(ends, "good") | {k: (False, ("truncated",)) for k in sig_cases}
    for drift in (WARN_DRIFT, PASS_DRIFT):
        d = run_offline(SequentialTrial(ends, 0.01, 0.01), drift, cut)
        assert d.verdict == "FAIL" and d.decided_by == "signatures"
    # One seed only is neither (the fixed rule needs two): BETWEEN, not a pass.
    one = answers(ends, "good") | {sorted(sig_cases)[0]: (False, ("truncated",))}
    d = run_offline(SequentialTrial(ends, 0.01, 0.01, batch=1), WARN_DRIFT, one)
    assert d.verdict == "BETWEEN"
    # A bad end with a signature in one seed only did not fail on it: drift decides as before.
    single = signature_ends(1)
    d = run_offline(SequentialTrial(single, 0.01, 0.01), WARN_DRIFT, answers(single, "good"))
    assert d.verdict == "FAIL" and d.decided_by == "drift"


def test_a_signature_bad_end_whose_accuracy_differs_too_passes_a_clean_trial_at_the_cap() -> None:
    # As the draft-eos bisect measured on the merged tree: the bad end cut 6 of 72 answers in
    # several seeds, enough for the ends to differ in accuracy but not for a trial to reach the
    # 1 % bounds; a trial that answers every request, the signature cases first, without a
    # signature, and loses some answers anyway, is like the good end, not BETWEEN.
    base = make_ends(loss_every=2, n_cells=4)
    cut = {c.key for c in base.cases if not c.bad_right}
    cases = tuple(EndCase(c.case_id, c.arm, c.cell, c.family, c.length, c.prompt_tokens, c.seed,
                          c.good_right, c.bad_right, c.repeat_right,
                          bad_signatures=("truncated",) if c.key in cut else ())
                  for c in base.cases)
    ends = TrialEnds(cases, WARN_DRIFT, 2, 8192)
    assert ends.accuracy_differs()
    lost = [c for c in ends.cases if not c.bad_right]
    ans = answers(ends, "good")
    for c in lost[:2]:
        ans[c.key] = (False, ())  # wrong, but not cut: the accuracy test alone stays inside
    d = run_offline(SequentialTrial(ends, 0.001, 0.001), WARN_DRIFT, ans)
    assert d.verdict == "PASS" and d.decided_by == "signatures" and d.accuracy_requests == d.cap
    assert d.thresholds[0] < d.log_lr < d.thresholds[1]
    for c in lost[:2]:
        ans[c.key] = (False, ("truncated",))  # cut again, in two seeds: FAIL
    d = run_offline(SequentialTrial(ends, 0.001, 0.001), WARN_DRIFT, ans)
    assert d.verdict == "FAIL" and d.decided_by == "signatures"


def test_undecided_at_the_cap_is_between() -> None:
    # The bad end loses 4 of 28; a trial losing half of those is like neither end, and at
    # error rates of 0.001 the 28 requests cannot settle it: BETWEEN, never a pass.
    ends = make_ends(loss_every=2, n_cells=4)
    lost = [c for c in ends.cases if not c.bad_right]
    ans = answers(ends, "good")
    for c in lost[::2]:
        ans[c.key] = (False, ())
    d = run_offline(SequentialTrial(ends, 0.001, 0.001), PASS_DRIFT, ans)
    assert d.verdict == "BETWEEN" and d.decided_by == "cap"
    assert d.accuracy_requests == d.cap == 28 and d.thresholds[0] < d.log_lr < d.thresholds[1]


def test_protocol_misuse_is_refused() -> None:
    test = SequentialTrial(make_ends(), 0.05, 0.05)
    with pytest.raises(ValueError):
        test.next_batch()  # drift first
    test.observe_drift(PASS_DRIFT)
    batch = test.next_batch()
    assert test.next_batch() == []  # the batch is not answered yet
    with pytest.raises(ValueError):
        test.observe(("nope", "cold"), True)
    assert len(batch) == 4


def test_ends_from_runs_pairs_rows_like_the_verdict() -> None:
    spec = tier_spec("smoke")

    def rows(ok) -> tuple[dict, ...]:
        return tuple({"case_id": f"needle/c{i % 4}/{i}", "family": "needle",
                      "cell": f"needle/c{i % 4}", "arm": "cold", "seed": i, "correct": ok(i),
                      "signatures": [], "prompt_tokens": 512, "length": 512}
                     for i in range(20))

    base = ProbeRun(spec, "x", {}, (), rows(lambda i: True))
    bad = ProbeRun(spec, "x", {}, (), rows(lambda i: i % 2 == 0))
    ends = ends_from_runs(base, bad, base)
    k = ends.counts()
    assert (k["n"], k["b"], k["c"], k["aa_b"]) == (20, 10, 0, 0)
    assert ends.accuracy_differs() and ends.bad_drift.status == "absent"
    no_rep = ends_from_runs(base, bad, None)
    assert not no_rep.has_repeat and all(c.repeat_right is None for c in no_rep.cases)


@st.composite
def ends_and_answers(draw):
    n = draw(st.integers(4, 60))
    cells = draw(st.integers(1, 6))
    cases, ans = [], {}
    for i in range(n):
        good = draw(st.booleans())
        bad = draw(st.booleans())
        rep = draw(st.sampled_from([None, good, not good]))
        length = 4096 * (1 + i % cells)
        c = EndCase(f"needle/L{length}/{i}", "cold", f"needle/L{length}", "needle", length,
                    length, i, good, bad, rep)
        cases.append(c)
        ans[c.key] = (draw(st.booleans()), ())
    drift = draw(st.sampled_from([PASS_DRIFT, FAIL_DRIFT]))
    trial_drift = draw(st.sampled_from([PASS_DRIFT, FAIL_DRIFT]))
    rates = draw(st.sampled_from([(0.05, 0.05), (0.01, 0.1), (0.2, 0.02)]))
    batch = draw(st.integers(1, 9))
    return TrialEnds(tuple(cases), drift, 3, 999), ans, trial_drift, rates, batch


@settings(max_examples=150, deadline=None)
@given(ends_and_answers(), st.integers(0, 2**16))
def test_every_decision_keeps_the_rules(example, seed: int) -> None:
    ends, ans, trial_drift, (ff, fp), batch = example
    d = run_offline(SequentialTrial(ends, ff, fp, seed=seed, batch=batch), trial_drift, ans)
    lo, hi = wald_thresholds(ff, fp)
    assert d.verdict in ("PASS", "FAIL", "BETWEEN")
    assert (d.false_fail, d.false_pass, d.thresholds) == (ff, fp, (lo, hi))
    assert 0 <= d.accuracy_requests <= d.cap <= len(ends.cases)
    if ends.accuracy_differs():
        assert d.cap == len(ends.cases)
    assert d.requests == d.accuracy_requests + d.drift_requests
    assert d.losses <= d.accuracy_requests and d.gains <= d.accuracy_requests
    if d.decided_by == "accuracy":
        assert (d.log_lr >= hi) if d.verdict == "FAIL" else (d.log_lr <= lo)
    if d.decided_by == "cap":
        assert d.verdict == "BETWEEN" and d.accuracy_requests == d.cap
    if trial_drift.status == "fail":
        assert d.verdict == "FAIL" and d.decided_by == "drift"
    # The same inputs give the same decision (seeded, no hidden state).
    again = run_offline(SequentialTrial(ends, ff, fp, seed=seed, batch=batch), trial_drift, ans)
    assert again == d


def test_plan_on_the_standard_tier() -> None:
    spec = tier_spec("standard")
    plan = plan_trial(spec, 0.05, 0.05, loss_rate=0.3, sims=40)
    assert plan.full_requests == 2 * 1008 + 16  # every case cold at 1 and warm at 16
    # a trial draws from both conditions (2016 requests): a twentieth of those at most
    assert plan.mean_requests_bad <= 1024 / 10
    assert plan.mean_requests_good <= 1024 / 10
    assert 0 < plan.cost_fraction_bad < 0.1 and 0 < plan.cost_fraction_good < 0.1
    assert plan.mean_requests_bad >= 16  # every drift transcript first
    assert plan_trial(spec, 0.05, 0.05, loss_rate=0.3, sims=40) == plan  # seeded
    tighter = plan_trial(spec, 0.01, 0.01, loss_rate=0.3, sims=40)
    assert tighter.mean_requests_good > plan.mean_requests_good
