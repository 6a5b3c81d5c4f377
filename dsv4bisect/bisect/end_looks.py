"""The ends' two looks: when the bad end's first, smaller probe already answers the bisect's
question (pure; docs/bisect.md, "Ends that stop when their question is answered").

A bisect asks of its ends one thing: is the bad end bad, and how (facts lost, hard signatures,
drift)? Each seed block's ends are first probed at look 1: the tier's every drift transcript and
`look1_share(spec)` of its accuracy cases (a seeded draw stratified over family and length, the
same for both ends, so every answer pairs), the good end's baseline and A/A repeat, then the bad
end.

How big look 1 is: as small as its question allows. Look 1 keeps the smallest share (in steps
of 0.01, at most `LOOK1_MAX_SHARE`) whose paired answers settle the smallest loss of facts in the
verdict table (`SMALLEST_LOSS` of the answers a good end right on 90 % gets right) with
P(look 2) <= `LOOK2_RISK` (`look2_chance`: the loss spread thin over every cell, no answer
gained, judged by `settles`). Look 2 costs both ends again (on one node a relaunch of the good
end and the rest of the tier: over 3000 s on the standard tier), so at 1e-3 it adds a few
seconds to a bisect's mean. On the standard tier that is 0.06 (168 answers; the trial probe
simulated on its 160 requests decides at the smallest loss in 74 / 63 of them, never at the
cap: docs/performance.md). Where no share up to `LOOK1_MAX_SHARE` gets there (smoke: 96 answers
in the whole tier), look 1 stays at `LOOK1_MAX_SHARE`: a large loss settles there, and a look
that cannot settle the smallest one costs a quarter of the tier, not more.
The bad end's look-1 verdict settles the ends when its evidence is one of:

* hard signatures (in >= 2 seeds on cases right in both A/A runs), a non-finite output, a
  crash: no threshold on a count decides these, a look more does not change them;
* a loss of facts at half the probe's error rate: the overall exact McNemar p <= ALPHA_OVERALL/2,
  or a cell failing at Holm p <= ALPHA_CELL/2 (the other half is left to the full look, so the
  two looks together false-FAIL at most the probe's own rate plus half of it: docs/bisect.md).

A WARN (drift, no loss of facts established) does not settle: that a bad end only drifts is a
claim that it loses no fact, which needs the whole evidence as a PASS does. Drift and its null
model are whole at look 1 already, but the facts are not (on the smoke tier's look 1,
`draft-eos` drifted and showed none of its truncations; `swa-ring-stale` lost 4 of 36 answers,
p = 0.06): a bisect on facts must not become a bisect on drift because look 1 was small.

Otherwise (a PASS, a WARN, a FAIL whose accuracy evidence is between the two rates) both
ends go on to the full tier (look 2: only the cases look 1 did not keep are probed, look 1's
requests complete the run, probe/looks.py), judged by the probe's own rule as before: a bad
end that passes says BAD-END-PASSES only on the whole evidence.
The trials of a block then replay the cases of the look that settled it.
"""

from __future__ import annotations

import functools
import math

from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.grid import accuracy_answers, cells, kept_case_ids
from dsv4bisect.probe.sequential_plan import SMALLEST_LOSS
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.probe.stats import mcnemar_one_sided

# of each (family, length) stratum's accuracy cases, at most; drift transcripts whole
LOOK1_MAX_SHARE = 0.25
LOOK2_RISK = 1e-3  # P(look 2) look 1 is sized for, at the verdict table's smallest loss
# what a settled look 1 established of the bad end: a loss of facts (`settles`), not a crash
LOSS_SETTLES = ("signatures", "accuracy")
GOOD_ACCURACY = 0.9  # the good end's accuracy in that world (as the trial probe is priced)
LOOK1_ALPHA_OVERALL = V.ALPHA_OVERALL / 2
LOOK1_ALPHA_CELL = V.ALPHA_CELL / 2


def look_spec(spec: ProbeSpec, look: int) -> ProbeSpec:
    """The spec of `look` (1 or 2) of the ends of `spec` (the full tier at its seed block).
    Where look 1 would keep every accuracy case anyway (one case per stratum: the ci tier),
    it is the full tier itself, hash and all: there is then no second look."""
    if look == 2 or single_look(spec):
        return spec.replace(case_share=1.0)
    return spec.replace(case_share=look1_share(spec))


def single_look(spec: ProbeSpec) -> bool:
    """Whether look 1 of `spec` keeps every accuracy case (then it is the only look)."""
    kept = kept_case_ids(spec.replace(case_share=look1_share(spec)))
    return kept is None or len(kept) == sum(n for c, n in cells(spec) if c.family != "drift")


@functools.lru_cache(maxsize=64)
def look1_share(spec: ProbeSpec) -> float:
    """Look 1's share of each stratum's accuracy cases for the tier of `spec`: the smallest
    (in steps of 0.01) whose paired answers keep P(look 2) at the smallest loss within
    LOOK2_RISK, else LOOK1_MAX_SHARE (the module docstring). A function of the grid's shape
    only: both ends, every seed block and the plan get the same share."""
    full = spec.replace(case_share=1.0, seed_block=0)
    for step in range(1, round(LOOK1_MAX_SHARE * 100)):
        share = step / 100
        if look2_chance(accuracy_answers(full.replace(case_share=share))) <= LOOK2_RISK:
            return share
    return LOOK1_MAX_SHARE


def look2_chance(pairs: int, good_accuracy: float = GOOD_ACCURACY,
                 loss_rate: float = SMALLEST_LOSS) -> float:
    """P(look 1 does not settle) on `pairs` paired answers, the good end right on each with
    `good_accuracy`, the bad end losing `loss_rate` of those, none gained: the fewest answers
    lost that settle (`settled`), and the binomial chance of fewer."""
    least = next((b for b in range(pairs + 1) if settled(b, pairs)), None)
    if least is None:
        return 1.0
    q, n = good_accuracy * loss_rate, pairs
    # the lower tail summed term by term: 1 - binom_sf would round a 1e-25 chance to 0
    return min(1.0, sum(math.exp(math.lgamma(n + 1) - math.lgamma(b + 1)
                                 - math.lgamma(n - b + 1) + b * math.log(q)
                                 + (n - b) * math.log1p(-q)) for b in range(least)))


def settled(lost: int, pairs: int) -> bool:
    """Whether a bad end's look 1 with `lost` of `pairs` paired answers lost, none gained (the
    judge's overall rule: probe/judge.py `_overall`), settles its block (`settles`)."""
    p = mcnemar_one_sided(lost, 0)
    verdict = V.Verdict(V.FAIL if p < V.ALPHA_OVERALL else V.PASS, (), {},
                        overall={"n": pairs, "b": lost, "c": 0, "p_value": p})
    return settles(verdict) is not None


def settles(bad: V.Verdict) -> str | None:
    """Why the bad end's look-1 verdict `bad` settles the ends (`signatures`, `accuracy`,
    `other`: a FAIL no count decides), or None: both ends go on to the full tier."""
    # A WARN (drift, no fact lost at look 1) never settles: that the bad end *only* drifts is
    # a claim that no fact is lost, which, like a PASS, needs the whole evidence. On the smoke
    # tier's look 1 `draft-eos` drifted and showed none of its truncations (they are in the
    # other two thirds of the cases); settled by drift, `auto` bisected it on drift and named
    # the patches that drift most (mhc-bf16, mma-decode), not nextn-speculation.
    if bad.verdict != V.FAIL:
        return None
    if bad.signatures.get("hard_fail"):
        return "signatures"
    overall_p = bad.overall.get("p_value")
    by_accuracy = overall_p is not None and overall_p < V.ALPHA_OVERALL
    failed_cells = [c for c in bad.cells if c.failed]
    if ((by_accuracy and overall_p <= LOOK1_ALPHA_OVERALL)
            or any(c.p_holm <= LOOK1_ALPHA_CELL for c in failed_cells)):
        return "accuracy"
    if not by_accuracy and not failed_cells:
        return "other"  # a crash, a non-finite output: the FAIL is not a count's
    return None


def beside_trial_rates(full: Noise) -> Noise:
    """The rates a trial beside the ends (bisect/rounds.py BESIDE) holds to where the bad end's
    look 1 beside it settled on a loss: it misses that loss no more often than look 1 is sized
    to (`LOOK2_RISK`), and fails a good configuration at the bisect's full-probe rate (`full`).
    The driver records it so (driver.beside_rates), the plan's world draws it so."""
    return Noise(full.false_fail, LOOK2_RISK)
