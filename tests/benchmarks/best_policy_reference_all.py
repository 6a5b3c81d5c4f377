"""The fewest `--test-cmd` calls any adaptive policy can make on reference-all (docs/bisect.md).

Not collected by pytest. Run: `python tests/benchmarks/best_policy_reference_all.py` (~3 min
on the 2-core CPU). The question of `test_bad_end_check.py`: one culprit among the five
candidates, a deterministic test command, default settings (5 %/5 % assumed, the risk tiers'
weights, half the prior on pairs, confidence 0.95). For every policy (any subset at every
step, chosen from the outcomes so far), the search's own posterior, stop rule and checks
(`confirm.checks_for`) decide when it stops, and the remedy check's own call counts when the
search did not test its configuration. A policy must name the right culprit for each of the
five. Printed: the least total calls after the good end (and the bad end, when it is run
first) over the five culprits, by exhaustive search with memoisation, beside what the search
itself makes; the search's stopping points are checked against this file's rule first.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dsv4bisect.bisect import remedy as rem
from dsv4bisect.bisect.plan.costs import plan_costs
from dsv4bisect.bisect.question import resolve_question
from dsv4bisect.bisect.search import confirm
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.hypotheses import HypothesisSpace, Priors, tier_weights
from dsv4bisect.bisect.search.records import Record
from dsv4bisect.bisect.search.search import Search
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.probe import verdict as V

QUESTION = resolve_question("reference-all", Overrides())
NAMES = QUESTION.candidates
N = len(NAMES)
FULL = (1 << N) - 1
NOISE = Noise(0.05, 0.05)
CONFIDENCE = 0.95
SPACE = HypothesisSpace(NAMES, 2, Priors(weights=tier_weights(QUESTION.tiers)))
TABLE = confirm.loglik(NOISE)  # [observed, true]


def subset(bits: int) -> frozenset[str]:
    return frozenset(NAMES[i] for i in range(N) if bits >> i & 1)


@functools.cache
def likelihood(bits: int, fails: bool) -> np.ndarray:
    """[H + 3] log P(outcome | hypothesis), as `Search._likelihood` (no BETWEEN here)."""
    obs = int(fails)
    mask = SPACE.mask(subset(bits))
    sets = np.where(SPACE.contained(mask), TABLE[obs, 1], TABLE[obs, 0])
    other = TABLE[obs, 0] if bits == 0 else TABLE[obs, 1] if bits == FULL else math.log(0.5)
    return np.concatenate([sets, [TABLE[obs, 1], TABLE[obs, 0], other]])


@functools.cache
def verdict(records: tuple[tuple[int, bool], ...], bad_end_first: bool) -> frozenset[str] | None:
    """The culprit set a search stops on after these records (in any order: the checks below
    count every record, as they do for a single culprit), or None while it goes on; a stop on
    anything but a single culprit is returned as the empty set (wrong for every culprit)."""
    log_post = SPACE.log_prior.copy()
    for bits, fails in records:
        log_post = log_post + likelihood(bits, fails)
    post = np.exp(log_post - log_post.max())
    post /= post.sum()
    seen = {bits for bits, _ in records}
    if 0 not in seen or (bad_end_first and FULL not in seen):
        return None
    if post[-3] + post[-2] > 1 - CONFIDENCE:  # the ends are not known to differ
        return None
    best = int(np.argmax(post))
    if post[best] < CONFIDENCE:
        return None
    hyp = SPACE.hypothesis(best)
    evidence = confirm.Evidence(
        records=[Record(subset(b), V.FAIL if f else V.PASS) for b, f in records],
        loglik=TABLE, confidence=CONFIDENCE, fresh_from=len(records),
        good_end_established=bool(post[-3] <= 1 - CONFIDENCE), candidates=NAMES, max_order=2)
    if not all(c.confirmed for c in confirm.checks_for(hyp, evidence)):
        return None
    return hyp.members if hyp.is_set and len(hyp.members) == 1 else frozenset()


INF = 10**6


@functools.cache
def least(records: tuple[tuple[int, bool], ...], culprits: frozenset[int], depth: int,
          bad_end_first: bool) -> int:
    """The least calls still to make, summed over the culprits (bit indices) not yet told
    apart, by any policy of at most `depth` more search trials; INF if none is right for all."""
    found = verdict(records, bad_end_first)
    if found is not None:
        if len(culprits) != 1 or found != subset(1 << next(iter(culprits))):
            return INF
        remedy = FULL & ~(1 << next(iter(culprits)))
        return 0 if any(bits == remedy for bits, _ in records) else 1
    if depth == 0:
        return INF
    best = INF
    for bits in range(1, FULL + (0 if bad_end_first else 1)):
        total = len(culprits)
        for fails in (True, False):
            part = frozenset(c for c in culprits if (bits >> c & 1) == fails)
            if part:
                total += least(tuple(sorted((*records, (bits, fails)))), part, depth - 1,
                               bad_end_first)
            if total >= best:
                break
        best = min(best, total)
    return best


def search_calls(bad_end_first: bool) -> list[int]:
    """What the search itself makes (the priced design at a test command's prices), its
    stopping point checked against `verdict`."""
    costs = plan_costs(None, None, given={}).costs
    out = []
    for c in range(N):
        search = Search(NAMES, noise=NOISE, priors=Priors(weights=tier_weights(QUESTION.tiers)),
                        costs=costs, bad_end_first=bad_end_first)
        records: list[tuple[int, bool]] = []
        while proposals := search.next():
            assert verdict(tuple(sorted(records)), bad_end_first) is None
            for s in proposals:
                bits = sum(1 << NAMES.index(x) for x in s)
                records.append((bits, bool(bits >> c & 1)))
                search.record(s, V.FAIL if bits >> c & 1 else V.PASS)
        assert verdict(tuple(sorted(records)), bad_end_first) == search.result().culprits
        remedy = rem.remedy_subset(NAMES, search.result().culprits)
        out.append(search.trials_used + (remedy not in {r.subset for r in search.records}))
    return out


def main() -> int:
    for first in (True, False):
        ends = 2 if first else 1
        calls = search_calls(first)
        best = least(tuple(sorted([(0, False), (FULL, True)] if first else [(0, False)])),
                     frozenset(range(N)), 5, first)
        label = "both ends first" if first else "the bad end checked by the first FAIL"
        print(f"{label}: the search makes {calls} (mean {sum(calls) / N:.1f}); "
              f"the best policy {(best + ends * N) / N:.1f} calls on average")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
