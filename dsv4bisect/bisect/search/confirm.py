"""Confirming a conclusion before the search stops (pure).

A culprit set C is reported only when every member is needed: C without x must pass. The
evidence for "C minus x passes" comes from trials of configurations T with C - {x} ⊆ T and
x ∉ T (under the monotone model, if T passes so does C minus x), as the log-likelihood ratio
log P(outcomes | passes) / P(outcomes | fails); it must reach confidence / (1 - confidence),
and under noise at least half of that (in log-odds) must come from trials run after C reached
the confidence: fresh evidence, not only the evidence that selected C (an adaptive search under
noise can be led to a wrong set by a streak of flipped outcomes; a fresh look catches that).
For a single culprit, C minus x is the good end, which the end checks establish.
Each trial counts at the error rates its own verdict holds to (a sequential trial probe states
them) where it carries them, else at the search's; a BETWEEN counts for neither side.

A culprit set must also be sufficient: C alone fails (see `_sufficiency`).
The catch-alls "good end fails" and "bad end passes" are confirmed the same way at that end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.hypotheses import BAD_END_PASSES, GOOD_END_FAILS, Hypothesis
from dsv4bisect.bisect.search.records import Record
from dsv4bisect.probe import verdict as V

# Error rates below this are taken as this in the likelihood, so that a noiseless search
# survives a contradiction (the least-contradicted hypothesis wins) instead of dividing by 0.
FLOOR = 1e-6


@lru_cache(maxsize=64)
def loglik(noise: Noise) -> np.ndarray:
    """[observed, true] natural-log likelihoods of a probe at these rates (0 = pass, 1 = fail)."""
    a, b = (min(max(r, FLOOR), 1 - FLOOR) for r in (noise.false_fail, noise.false_pass))
    table = np.log(np.array([[1 - a, b], [a, 1 - b]]))
    table.flags.writeable = False  # shared through the cache
    return table


@dataclass(frozen=True)
class Check:
    """Evidence that one configuration behaves as the conclusion requires."""

    config: frozenset[str]  # C minus `member`; C itself (sufficiency); or an end
    member: str | None  # the culprit removed; None for sufficiency and end checks
    expect: str  # PASS (minimality, bad end passes) or FAIL (sufficiency, good end fails)
    log10_ratio: float  # log10 P(outcomes | as expected) / P(outcomes | not), all trials
    fresh_log10_ratio: float  # the same over the trials run since the conclusion led
    trials: int  # trials that counted
    confirmed: bool


@dataclass(frozen=True)
class Evidence:
    """What the checks need from the search's state."""

    records: Sequence[Record]
    loglik: np.ndarray  # [observed, true] natural-log likelihoods (0 = pass, 1 = fail)
    confidence: float
    fresh_from: int  # index of the first record that counts (0 when noiseless)
    good_end_established: bool  # P(good end fails) <= 1 - confidence
    candidates: tuple[str, ...]
    max_order: int
    # every culprit set's sufficiency asks the full ratio and a fresh look, not only the
    # largest order's: a search of several trials a round, or of sequential trial probes
    # (`_sufficiency`)
    fresh_sufficiency: bool = False

    def log10_lr(self, record: Record) -> np.ndarray:
        """[observed, true] log10 likelihoods for one record: its own rates, else the search's."""
        table = self.loglik if record.noise is None else loglik(record.noise)
        return table / math.log(10)


def checks_for(hyp: Hypothesis, ev: Evidence) -> tuple[Check, ...]:
    """The checks a conclusion needs; `unexplained` needs none."""
    everything = frozenset(ev.candidates)
    if hyp.kind == BAD_END_PASSES:
        return (_check(everything, None, V.PASS, ev, lambda s: s == everything),)
    if hyp.kind == GOOD_END_FAILS:
        return (_check(frozenset(), None, V.FAIL, ev, lambda s: not s),)
    if not hyp.is_set:
        return ()
    out = []
    for x in sorted(hyp.members, key=ev.candidates.index):
        rest = hyp.members - {x}
        check = _check(rest, x, V.PASS, ev, lambda s, r=rest, m=x: m not in s and r <= s)
        if not rest:  # the good end: established by the end checks, not by fresh trials
            check = Check(
                rest,
                x,
                V.PASS,
                check.log10_ratio,
                check.fresh_log10_ratio,
                check.trials,
                ev.good_end_established,
            )
        out.append(check)
    if hyp.members != everything:
        out.append(_sufficiency(hyp.members, ev, fresh=len(hyp.members) == ev.max_order
                                or ev.fresh_sufficiency))
    return tuple(out)


def _sufficiency(members: frozenset[str], ev: Evidence, fresh: bool) -> Check:
    """Does C alone fail? Evidence per other candidate y: trials of configurations that contain
    C and not y, which fail only if y is not needed. The weakest y decides; running C alone
    speaks for every y at once. Below the largest order, C + {y} competes in the posterior, but
    the prior can favour C so much that the posterior reaches the confidence with no trial that
    tells them apart (a single against its pair at n = 64, noiseless): half the log-odds must
    come from the data. At the largest order nothing in the model competes from above, so the
    full ratio is needed, and the fresh-look rule applies. A search of several trials a round,
    or of sequential trial probes (an engine's hot trials), asks the same of every set
    (`Evidence.fresh_sufficiency`): one flipped trial among those that settle a single named a
    wrong single at about 0.96 posterior in up to 6 of 400 simulated bisects on two and four
    nodes, and on one node of `dsv4-flash-tp8-all`, whose trials wait for no launch; none or
    1 in 2400 with the fresh look (docs/bisect.md, "When it stops")."""
    need = math.log10(ev.confidence / (1 - ev.confidence))
    others = [y for y in ev.candidates if y not in members]
    ratio = dict.fromkeys(others, 0.0)
    fresh_lr = dict.fromkeys(others, 0.0)
    trials = 0
    for i, r in enumerate(ev.records):
        if not r.evidence or not members <= r.subset:
            continue
        obs, lr = 1 if r.outcome == V.FAIL else 0, ev.log10_lr(r)
        step = float(lr[obs, 1] - lr[obs, 0])
        trials += 1
        for y in others:
            if y not in r.subset:
                ratio[y] += step
                fresh_lr[y] += step if i >= ev.fresh_from else 0.0
    need_all, need_fresh = (need, need / 2) if fresh else (need / 2, -math.inf)
    ok = all(ratio[y] >= need_all - 1e-9 and fresh_lr[y] >= need_fresh - 1e-9 for y in others)
    weakest = min(others, key=lambda y: (min(ratio[y], 2 * fresh_lr[y]), ev.candidates.index(y)))
    return Check(members, None, V.FAIL, ratio[weakest], fresh_lr[weakest], trials, ok)


def _check(
    config: frozenset[str], member: str | None, expect: str, ev: Evidence, counts: object
) -> Check:
    need = math.log10(ev.confidence / (1 - ev.confidence))
    truth, other = (0, 1) if expect == V.PASS else (1, 0)
    ratio, fresh, trials = 0.0, 0.0, 0
    for i, r in enumerate(ev.records):
        if not r.evidence or not counts(r.subset):  # type: ignore[operator]
            continue
        obs, lr = 1 if r.outcome == V.FAIL else 0, ev.log10_lr(r)
        step = float(lr[obs, truth] - lr[obs, other])
        ratio += step
        fresh += step if i >= ev.fresh_from else 0.0
        trials += 1
    confirmed = ratio >= need - 1e-9 and fresh >= need / 2 - 1e-9
    return Check(config, member, expect, ratio, fresh, trials, confirmed)


def pending(
    checks: Sequence[Check], skipped: set[frozenset[str]], candidates: tuple[str, ...]
) -> list[frozenset[str]]:
    """Configurations to run for the unconfirmed checks (skipped ones routed around: C minus x
    falls back to everything but x)."""
    out = []
    for check in checks:
        if check.confirmed:
            continue
        options = [check.config]
        if check.member is not None:
            options.append(frozenset(candidates) - {check.member})
        for option in options:
            if option not in skipped:
                out.append(option)
                break
    return out
