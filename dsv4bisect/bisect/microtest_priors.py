"""Prior weights from the microtest: each candidate's measured error against its tolerance.

Pure (no torch, no I/O): `coverage` says whether the microtest measures what a candidate runs
in this deployment, `ratio` turns a microtest row into error / tolerance, `multiplier` is the
curve, and `priors_from_rows` maps a run's rows to one `CandidatePrior` per candidate. The run
itself is `dsv4bisect/cli/bisect_priors.py`; docs/bisect.md "Priors from the microtest" has the
curve, the neutral cases and measured figures.

The curve, in r = error / tolerance (the worst counted row of the patch; a `min` bound such as
the indexer's overlap >= 99 % is read as its shortfall, (1 - value) / (1 - tolerance)):

    r <= 1 (inside):   m = sqrt(r), clipped to [1/4, 1]     (r = 1/4 -> 0.5; r <= 1/16 -> 1/4)
    r >  1 (FAIL):     m = 8 sqrt(r), clipped to [8, 16]    (r >= 4 -> 16)

Monotone in r, positive and bounded (never excluded). The step at the tolerance is what makes a
FAIL the favourite whatever the risk tiers: tier weights span 4x (2.0 .. 0.5), so a failing
tier-3 patch (0.5 x 8 = 4) still outweighs a tier-1 patch at its tolerance (2.0 x 1 = 2).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dsv4bisect.microtest.markdown import format_tolerance, format_value
from dsv4bisect.microtest.results import Row, layer_ranges
from dsv4bisect.microtest.spec import MICROTESTED

LIGHTEST = 0.25  # far inside its tolerance
AT_TOLERANCE = 1.0  # inside, at the edge: no evidence either way
FAIL_FLOOR = 8.0  # just outside: above every non-failing candidate for any tier weights
HEAVIEST = 16.0  # 4x outside or more
# Deliveries under which our op is what runs (the embedded engine's swap, our SGLang hook).
OUR_OP = frozenset({"reference", "hook", ""})


def multiplier(r: float) -> float:
    """The prior weight multiplier for error / tolerance `r` (>= 0; inf for a count above 0)."""
    if math.isnan(r) or r > 1:  # NaN: a figure that could not be computed counts as outside
        return HEAVIEST if math.isnan(r) else min(HEAVIEST, FAIL_FLOOR * math.sqrt(r))
    return min(AT_TOLERANCE, max(LIGHTEST, math.sqrt(max(r, 0.0))))


def ratio(row: Row) -> float:
    """error / tolerance of a counted row with a tolerance: 0 exact, 1 at the tolerance, > 1
    outside it (inf for a nonzero count against a zero tolerance or a NaN figure)."""
    if row.tolerance is None:
        raise ValueError(f"row `{row.case}` of {row.patch} is informational: no tolerance")
    value, tol = row.value, row.tolerance
    if math.isnan(value):
        return math.inf
    if row.bound == "min":  # a share that must stay high: compare the shortfalls
        value, tol = 1.0 - value, 1.0 - tol
    value = max(value, 0.0)
    if tol <= 0:
        return 0.0 if value == 0 else math.inf
    return value / tol


@dataclass(frozen=True)
class Coverage:
    """Whether the microtest measures what a candidate runs here; `why` when it does not."""

    measured: bool
    why: str = ""


def coverage(name: str, delivery: str, embedded: str | None, *, builtin: bool = True,
             unmodelled_runner: str | None = None) -> Coverage:
    """`delivery`: how "on" reaches the engine (Question.deliveries: reference | hook |
    env VAR=V ...); `embedded`: the patch's `embedded` field (what the embedded engine does for
    it, often naming the microtested op that models it); `unmodelled_runner`: the profile's MoE
    backend when the scaling contract has no model of it (hash-topk-scaling only)."""
    if not builtin:
        return Coverage(False, "a custom patch: the microtest has no check for it")
    if name in MICROTESTED:
        if delivery not in OUR_OP:
            return Coverage(False, f"on this release \"on\" is SGLang's own code ({delivery}); "
                                   "the microtest measures our op, not the release's")
        if name == "hash-topk-scaling" and unmodelled_runner:
            return Coverage(False, f"the MoE backend `{unmodelled_runner}` is not one the "
                                   "microtest's scaling contract models")
        return Coverage(True)
    models = [m for m in MICROTESTED if m in (embedded or "")]
    if models:
        return Coverage(False, f"SGLang's own kernel ({delivery or 'upstream'}): the microtest's "
                               f"{models[0]} check measures our op that models it, not the "
                               "release's code")
    if delivery.startswith("args") or "speculative" in (embedded or ""):
        return Coverage(False, "no microtest check: it changes how the server decodes, not "
                               "an op the microtest measures")
    return Coverage(False, "no microtest check: it switches SGLang's own kernel")


@dataclass(frozen=True)
class CandidatePrior:
    """One candidate's multiplier of its prior weight, and why."""

    name: str
    multiplier: float
    reason: str
    ratio: float | None = None  # worst error / tolerance; None: not measured (neutral)


@dataclass(frozen=True)
class MicrotestPriors:
    """The microtest's multipliers per candidate (`off`: why none were computed)."""

    priors: tuple[CandidatePrior, ...] = ()
    seconds: float = 0.0  # the microtest's wall time, torch's import included
    off: str = ""  # "" when the microtest ran
    checkpoint: str = ""
    cached: str = ""  # when the microtest measured them, if they came from the cache

    @classmethod
    def disabled(cls, why: str) -> MicrotestPriors:
        return cls(off=why)

    @property
    def weights(self) -> dict[str, float]:
        return {p.name: p.multiplier for p in self.priors}

    @property
    def reasons(self) -> dict[str, str]:
        return {p.name: p.reason for p in self.priors}

    def apply(self, base: Mapping[str, float]) -> dict[str, float]:
        """`base` (tier or profile weights) times the multipliers; names without one keep
        their weight."""
        mult = self.weights
        return {name: w * mult.get(name, 1.0) for name, w in base.items()}


def priors_from_rows(candidates: Sequence[str], rows: Iterable[Row],
                     cover: Mapping[str, Coverage], seconds: float = 0.0,
                     checkpoint: str = "") -> MicrotestPriors:
    """One prior per candidate from the microtest's rows: the worst counted row of each measured
    candidate sets its multiplier; unmeasured candidates stay at 1.0 with the reason."""
    by_patch: dict[str, list[Row]] = {}
    for row in rows:
        if row.counted and row.tolerance is not None:
            by_patch.setdefault(row.patch, []).append(row)
    out = []
    for name in candidates:
        c = cover.get(name, Coverage(False, "no microtest check"))
        if not c.measured:
            out.append(CandidatePrior(name, 1.0, f"neutral: {c.why}"))
            continue
        measured = by_patch.get(name, [])
        if not measured:
            out.append(CandidatePrior(name, 1.0, "neutral: no chosen layer or context applies"))
            continue
        worst = max(measured, key=ratio)
        r = ratio(worst)
        m = multiplier(r)
        outside = sum(ratio(x) > 1 for x in measured)
        where = f"layer{'s' if len(worst.layers) > 1 else ''} {layer_ranges(worst.layers)}"
        what = (f"{'FAIL' if r > 1 else 'ok'} at {_times(r)} its tolerance ({worst.case}, "
                f"{where}: {format_value(worst)}, want {format_tolerance(worst)}"
                + (f"; {outside} of {len(measured)} rows outside)" if outside > 1 else ")"))
        out.append(CandidatePrior(name, m, what, r))
    return MicrotestPriors(tuple(out), seconds, "", checkpoint)


def _times(r: float) -> str:
    if math.isinf(r):
        return "inf x"
    return f"{r:.0f}x" if r >= 10 else f"{r:.2g}x"
