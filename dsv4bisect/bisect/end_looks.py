"""The ends' two looks: when the bad end's first, smaller probe already answers the bisect's
question (pure; docs/bisect.md, "Ends that stop when their question is answered").

A bisect asks of its ends one thing: is the bad end bad, and how (facts lost, hard signatures,
drift)? Each seed block's ends are first probed at look 1: the tier's every drift transcript and
`LOOK1_SHARE` of its accuracy cases (a seeded draw stratified over family and length, the same
for both ends, so every answer pairs), the good end's baseline and A/A repeat, then the bad end.
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

from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.grid import cells, kept_case_ids
from dsv4bisect.probe.spec import ProbeSpec

LOOK1_SHARE = 0.25  # of each (family, length) stratum's accuracy cases; drift transcripts whole
LOOK1_ALPHA_OVERALL = V.ALPHA_OVERALL / 2
LOOK1_ALPHA_CELL = V.ALPHA_CELL / 2


def look_spec(spec: ProbeSpec, look: int) -> ProbeSpec:
    """The spec of `look` (1 or 2) of the ends of `spec` (the full tier at its seed block).
    Where look 1 would keep every accuracy case anyway (one case per stratum: the ci tier),
    it is the full tier itself, hash and all: there is then no second look."""
    if look == 2 or single_look(spec):
        return spec.replace(case_share=1.0)
    return spec.replace(case_share=LOOK1_SHARE)


def single_look(spec: ProbeSpec) -> bool:
    """Whether look 1 of `spec` keeps every accuracy case (then it is the only look)."""
    kept = kept_case_ids(spec.replace(case_share=LOOK1_SHARE))
    return kept is None or len(kept) == sum(n for c, n in cells(spec) if c.family != "drift")


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
