"""The sequential trial probe: does a configuration behave like the good end or the bad end?

Pure (no I/O). Inside a bisect both ends were measured at the tier's full size; a trial then only
has to tell "like good" from "like bad", so it stops as soon as either is decided at the error
rates the search asks for (docs/probe.md, "The sequential trial probe (inside a bisect)"):

1. Drift and hard signatures first. A trial drift FAIL is a FAIL. Ends that differ only by drift
   (no accuracy difference, and no hard signatures in >= 2 seeds at the bad end) are decided
   by drift alone: like bad when the trial's drift warns or fails and reaches half of the bad
   end's, like good when it passes and stays under half, BETWEEN otherwise. Hard signatures
   (in >= 2 seeds, on cases the good end got right in both A/A runs) FAIL. A bad end that
   failed on hard signatures lost facts: its drift does not decide, its signature cases are
   asked first, and where its accuracy loss alone is too small to differ, a trial that answers
   every one of them without a signature is like good.
   With the policy's relative drift rule (`bisect --drift relative`) a trial's drift is judged
   against the ends instead of the `run` gates: a drift whose mean KL is less than half the bad
   end's (in the bad end's trigger view) is nearer the good end, so it is not a FAIL; where the
   ends differ only by drift it is like good, and where they differ in accuracy the answers
   decide. For a baseline at which every kernel change drifts past the gates (NVFP4 W4A4
   experts: docs/reference-engine.md) while one change makes the bad end bad.
2. Accuracy requests in batches, in a seeded random order across the grid's cells, each case
   weighted by the information one request in its cell carries (the Jeffreys divergence between
   the two hypotheses' predictions there), plus a floor so every cell is eventually drawn: a
   fault the ends showed only at the longest length is looked for there first, and short cases,
   where both hypotheses predict the same, move the test by almost nothing.
   Every request is replayed under the condition the ends measured it in (`EndCase.group`):
   a row measured at concurrency 1 alone (a cold request after a cache flush, a warm one turn
   by turn, as the fixed probe sends them), a row measured at concurrency c > 1 with its
   concurrency group: a window of c consecutive requests of that level in the fixed probe's
   seeded submission order (`tasks.submission_order`; a shorter remainder joins the last
   window), sent after one cache flush with c in flight in that order, so its batch mates are
   its neighbours in the ends' level (`condition_groups`). A cell is a grid cell under one
   condition (arm, concurrency): a fault that loses answers only when batched is a rate of
   the concurrency cells, not diluted by the concurrency-1 ones. The draw order is over units
   (a single request or a whole group), each weighted by the sum of its cases' weights, so a
   unit comes first with the probability that one of its cases would; a batch is whole units
   until it holds at least `batch` requests.
3. Paired scoring against the good end: on cases the good end got right, a wrong answer is a
   loss; on cases it got wrong, a right answer is a gain. Each hypothesis predicts both rates:
   - like good: the good end's A/A loss (gain) rate plus a benign flip rate (1 %), as a Beta
     prior worth 200 requests pooled over the grid (the fixed probe PASSes symmetric flips, so
     the sequential test must accept them too);
   - like bad: per family x length stratum, the bad end's measured loss (gain) rate as a Beta
     posterior shrunk toward its overall rate with a prior worth 20 requests, and never less
     than like good predicts (a fault adds to the noise).
   The measured figures are estimates: every prediction is a Beta-binomial predictive, updated
   with the trial's own answers as they come.
4. A truncated SPRT on the log-likelihood ratio L = log P(answers | bad) - log P(answers | good):
   "like bad" (FAIL) when L >= log((1 - false_pass) / false_fail), "like good" (PASS) when
   L <= log(false_pass / (1 - false_fail)) (Wald's bounds), checked after every batch. At the
   cap (every accuracy case of the tier) the answer is BETWEEN: evidence for neither end,
   never a pass.
   How the error rates hold with groups: a group adds each of its cases' answers to L, one
   term per request as any request does, and L is checked only once the whole group (the
   whole batch) is in. Wald's bounds hold at any stopping rule that looks at L after some
   observations and not others (checking less often only overshoots the bound, which makes
   the rates conservative), and both hypotheses' rates are those of the same condition the
   group replays (the cell includes arm and concurrency): the test still compares the ends'
   own rates, per request, under the condition they were measured in. What the likelihood
   does not model is the dependence of batch mates' answers on each other (one bad forward
   can cost several of them): within a group the evidence is counted per request, as the
   fixed probe's McNemar test counts it.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsv4bisect.errors import ConfigError
from dsv4bisect.policy import DEFAULT_POLICY, TrialPolicy
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.drift import non_finite_reason
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.stats import mcnemar_one_sided

LIKE_GOOD, LIKE_BAD = "like good", "like bad"

BENIGN_FLIP_RATE = 0.01  # losses (gains) per request a harmless numeric change may cause
GOOD_PRIOR_REQUESTS = 200.0  # weight of the "like good" noise prior, in requests
SHRINK_REQUESTS = 20.0  # weight of the level above in each "like bad" rate (stratum, cell)
WEIGHT_FLOOR = 0.1  # every cell's draw weight is at least this share of the mean weight
ENDS_ALPHA = 0.05  # one-sided McNemar: the ends differ in accuracy below this
DEFAULT_BATCH = 4
# The error rates a bisect asks of its sequential trials (false fail, false pass). 1 % costs a
# few requests more than 5 % (docs/probe.md: 26 against 25 on a bad end losing 30 %) and saves
# the search its re-tests; it also bounds the one world that slips past the asked rate (a fault
# that loses different cases each run: 2 % instead of 8 % at a 5 pp gap).
TRIAL_ERROR_RATES = (0.01, 0.01)
DRIFT_LIKE_BAD = 0.5  # drift-only ends: a trial this far toward the bad end's drift is like it
_DRIFT_RANK = {"absent": -1, "pass": 0, "warn": 1, "fail": 2}
CellKey = tuple[str, str, int]  # grid cell, arm, concurrency: a cell under one condition
Stratum = tuple[str, int, str, int]  # family, length, arm, concurrency


@dataclass(frozen=True)
class EndCase:
    """One accuracy request as both ends answered it at full size."""

    case_id: str
    arm: str
    cell: str  # family/L/d/t key
    family: str
    length: int  # nominal
    prompt_tokens: int
    seed: int
    good_right: bool
    bad_right: bool
    repeat_right: bool | None = None  # None: the A/A repeat did not run this request
    good_signatures: tuple[str, ...] = ()
    bad_signatures: tuple[str, ...] = ()
    repeat_signatures: tuple[str, ...] = ()
    concurrency: int = 1  # the level the ends measured it at
    group: int = 0  # its concurrency group in that level (level 1: every request alone)
    position: int = 0  # its place in the level's submission order (the group is sent so)

    @property
    def key(self) -> tuple[str, str, int]:
        """The pairing key across runs: (case_id, arm, concurrency), as `run.row_key`."""
        return (self.case_id, self.arm, self.concurrency)

    @property
    def condition(self) -> tuple[str, int]:
        return (self.arm, self.concurrency)

    @property
    def unit(self) -> tuple[Any, ...]:
        """What is drawn and sent as one: the request alone at concurrency 1, else its
        concurrency group (every request of it, together)."""
        return self.key if self.concurrency == 1 else ("group", self.concurrency, self.group)

    @property
    def stable_right(self) -> bool:
        """Right in the baseline and (where it ran) in the A/A repeat."""
        return self.good_right and self.repeat_right is not False


@dataclass(frozen=True)
class DriftFigures:
    """One run's drift against the good end's baseline (judge.drift_check's outcome): its
    status, the view that set it, and (mean KL, top-1 agreement) per view."""

    status: str  # pass | warn | fail | absent
    where: str | None = None
    kl_mean: float | None = None
    top1_agreement: float | None = None
    views: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, drift: Mapping[str, Any]) -> DriftFigures:
        trigger = drift.get("trigger") or {}
        cand = drift.get("candidate") or {}
        views: dict[str, tuple[float, float]] = {
            where: (float(v["kl_mean"]), float(v["top1_agreement"]))
            for where, v in (drift.get("views") or {}).items()}
        if cand and not views:  # a verdict from before the per-view figures
            views["all positions"] = (float(cand["kl_mean"]), float(cand["top1_agreement"]))
            for key, b in (cand.get("by_position") or {}).items():
                if b["n"] >= V.DRIFT_MIN_BUCKET:
                    views[f"positions {key}"] = (float(b["kl_mean"]), float(b["top1_agreement"]))
        return cls(str(drift.get("status", "absent")), trigger.get("where"),
                   trigger.get("kl_mean"), trigger.get("top1_agreement"), views)

    def share_of(self, bad: DriftFigures, *, kl_only: bool = False) -> float | None:
        """How far this run's drift goes toward `bad`'s, in `bad`'s trigger view: the larger
        of the mean-KL ratio and the top-1-shortfall ratio (1 = as far as the bad end), or the
        mean-KL ratio alone (`kl_only`: KL adds up over independent small changes, while top-1
        agreement saturates: near-tied positions flip under any change first)."""
        if bad.where is None or bad.kl_mean is None or bad.top1_agreement is None:
            return None
        mine = self.views.get(bad.where)
        if mine is None:
            return None
        kl = mine[0] / bad.kl_mean if bad.kl_mean > 0 else 0.0
        if kl_only:
            return kl
        short = ((1.0 - mine[1]) / (1.0 - bad.top1_agreement)
                 if bad.top1_agreement < 1.0 else 0.0)
        return max(kl, short)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "where": self.where, "kl_mean": self.kl_mean,
                "top1_agreement": self.top1_agreement,
                "views": {w: list(v) for w, v in self.views.items()}}


@dataclass(frozen=True)
class TrialEnds:
    """What the ends measured: every accuracy request, the bad end's drift, the drift size."""

    cases: tuple[EndCase, ...]
    bad_drift: DriftFigures
    drift_requests: int = 0  # drift transcripts a trial scores first
    drift_tokens: int = 0  # their prompt tokens in all (the plan's cost)
    has_repeat: bool = True

    def counts(self) -> dict[str, int]:
        """Paired counts of the bad end against the good end, and of the A/A repeat."""
        rep = [c for c in self.cases if c.repeat_right is not None]
        return {"n": len(self.cases),
                "good_right": sum(c.good_right for c in self.cases),
                "b": sum(c.good_right and not c.bad_right for c in self.cases),
                "c": sum(not c.good_right and c.bad_right for c in self.cases),
                "aa_n": len(rep), "aa_right": sum(c.good_right for c in rep),
                "aa_b": sum(c.good_right and not c.repeat_right for c in rep),
                "aa_c": sum(not c.good_right and bool(c.repeat_right) for c in rep)}

    def accuracy_differs(self) -> bool:
        k = self.counts()
        return mcnemar_one_sided(k["b"], k["c"]) < ENDS_ALPHA

    def bad_signature_cases(self) -> list[EndCase]:
        """Cases where the bad end showed a hard signature the stably-right good end did not."""
        return [c for c in self.cases
                if c.stable_right and set(c.bad_signatures) - set(c.good_signatures)]


@dataclass(frozen=True)
class Decision:
    """The trial's verdict, with the evidence and the error rates it holds to."""

    verdict: str  # PASS (like good) | FAIL (like bad, or a hard signature / drift fail) | BETWEEN
    decided_by: str  # drift | signatures | accuracy | cap | ends
    requests: int  # drift transcripts + accuracy requests sent
    accuracy_requests: int
    drift_requests: int
    cap: int  # accuracy requests at the tier's full size
    false_fail: float  # P(decide like bad | truly like good) the test holds to
    false_pass: float  # P(decide like good | truly like bad)
    log_lr: float
    thresholds: tuple[float, float]  # (like good at or below, like bad at or above)
    losses: int
    gains: int
    reasons: tuple[str, ...]
    drift: DriftFigures | None = None
    prompt_tokens: int = 0  # of every request sent (drift transcripts + accuracy requests)

    @property
    def outcome(self) -> str | None:
        return {V.PASS: LIKE_GOOD, V.FAIL: LIKE_BAD}.get(self.verdict)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "outcome": self.outcome, "decided_by": self.decided_by,
                "requests": self.requests, "accuracy_requests": self.accuracy_requests,
                "drift_requests": self.drift_requests, "cap": self.cap,
                "false_fail": self.false_fail, "false_pass": self.false_pass,
                "log_lr": self.log_lr, "thresholds": list(self.thresholds),
                "losses": self.losses, "gains": self.gains, "prompt_tokens": self.prompt_tokens,
                "reasons": list(self.reasons),
                "drift": self.drift.to_dict() if self.drift else None}


def wald_thresholds(false_fail: float, false_pass: float) -> tuple[float, float]:
    """(lower, upper) on log LR(bad : good): like good at or below, like bad at or above."""
    if not (0.0 < false_fail < 0.5 and 0.0 < false_pass < 0.5):
        raise ValueError("error rates must be in (0, 0.5)")
    return (math.log(false_pass / (1.0 - false_fail)), math.log((1.0 - false_pass) / false_fail))


@dataclass
class _Beta:
    """A Beta(a, b) prior on a rate, updated with the trial's own events (Beta-binomial)."""

    a: float
    b: float
    k: int = 0
    m: int = 0

    def p(self) -> float:
        return (self.a + self.k) / (self.a + self.b + self.m)

    def add(self, event: bool) -> None:
        self.k += int(event)
        self.m += 1


def _prior(mean: float, weight: float, events: int = 0, trials: int = 0) -> _Beta:
    return _Beta(weight * mean + events, weight * (1.0 - mean) + trials - events)


def _either(p: float, q: float) -> float:
    """P(at least one of two independent events)."""
    return 1.0 - (1.0 - p) * (1.0 - q)


def _jeffreys(p: float, q: float) -> float:
    """Symmetric KL between Bernoulli(p) and Bernoulli(q): the information one request adds."""
    p, q = min(max(p, 1e-9), 1 - 1e-9), min(max(q, 1e-9), 1 - 1e-9)
    return (p - q) * (math.log(p / q) - math.log((1 - p) / (1 - q)))


class _Model:
    """Both hypotheses' predictions of losses (good end right) and gains (good end wrong)."""

    def __init__(self, ends: TrialEnds, benign: float) -> None:
        k = ends.counts()
        aa_right, aa_wrong = k["aa_right"], k["aa_n"] - k["aa_right"]
        # like good: the A/A's own rates (Jeffreys-smoothed) and a benign flip rate on top.
        self.good_loss = _prior(_either((k["aa_b"] + 0.5) / (aa_right + 1), benign),
                                GOOD_PRIOR_REQUESTS)
        self.good_gain = _prior(_either((k["aa_c"] + 0.5) / (aa_wrong + 1), benign),
                                GOOD_PRIOR_REQUESTS)
        # The bad end against the good end: [right, lost, wrong, gained] per stratum and cell.
        strata: dict[Stratum, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        per_cell: dict[CellKey, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self.stratum_of: dict[CellKey, Stratum] = {}
        for c in ends.cases:
            cell = cell_of(c)
            self.stratum_of[cell] = (c.family, c.length, *c.condition)
            for acc in (strata[self.stratum_of[cell]], per_cell[cell]):
                if c.good_right:
                    acc[0] += 1
                    acc[1] += not c.bad_right
                else:
                    acc[2] += 1
                    acc[3] += c.bad_right
        # Like bad: the bad end's rate per family x length stratum, shrunk toward its overall
        # rate (Jeffreys-smoothed) by a prior worth SHRINK_REQUESTS requests. The likelihood
        # uses the stratum, not the cell: the draw favours cells where the bad end happened to
        # lose, and a cell's own rate would then overstate what a trial loses there.
        loss_all = (k["b"] + 0.5) / (k["good_right"] + 1)
        gain_all = (k["c"] + 0.5) / (k["n"] - k["good_right"] + 1)
        self.bad_loss: dict[Stratum, _Beta] = {}
        self.bad_gain: dict[Stratum, _Beta] = {}
        for key, (right, lost, wrong, gained) in strata.items():
            self.bad_loss[key] = _prior(loss_all, SHRINK_REQUESTS, lost, right)
            self.bad_gain[key] = _prior(gain_all, SHRINK_REQUESTS, gained, wrong)
        # The draw weights do use the cell: its own counts shrunk toward its stratum.
        self.cell_rates: dict[CellKey, tuple[float, float]] = {}
        for cell, (right, lost, wrong, gained) in per_cell.items():
            st = self.stratum_of[cell]
            self.cell_rates[cell] = (
                _prior(self.bad_loss[st].p(), SHRINK_REQUESTS, lost, right).p(),
                _prior(self.bad_gain[st].p(), SHRINK_REQUESTS, gained, wrong).p())
        self.right_share = {cell: v[0] / max(1, v[0] + v[2]) for cell, v in per_cell.items()}

    def predict(self, cell: CellKey, good_right: bool) -> tuple[float, float]:
        """P(event) under (like bad, like good): a loss where the good end was right, else a
        gain. Like bad never predicts fewer events than like good: a fault adds to the noise."""
        noise = (self.good_loss if good_right else self.good_gain).p()
        bad = (self.bad_loss if good_right else self.bad_gain)[self.stratum_of[cell]].p()
        return max(noise, bad), noise

    def add(self, cell: CellKey, good_right: bool, event: bool) -> None:
        (self.good_loss if good_right else self.good_gain).add(event)
        (self.bad_loss if good_right else self.bad_gain)[self.stratum_of[cell]].add(event)

    def weight(self, cell: CellKey) -> float:
        """Expected information of one request in `cell` (before any trial answer), from the
        cell's own shrunk rates."""
        share, (loss, gain) = self.right_share[cell], self.cell_rates[cell]
        return (share * _jeffreys(max(loss, self.good_loss.p()), self.good_loss.p())
                + (1.0 - share) * _jeffreys(max(gain, self.good_gain.p()), self.good_gain.p()))


def draw_units(ends: TrialEnds, seed: int, benign: float = BENIGN_FLIP_RATE
               ) -> tuple[list[tuple[EndCase, ...]], int]:
    """Every accuracy case in draw order, as the units it is sent in (a request alone, or a
    concurrency group in its submission order), and how many units lead: the units of the bad
    end's signature cases (one case per seed) first, then a weighted random order without
    replacement (Efraimidis-Spirakis keys) of the other units, each weighted by the sum of its
    cases' weights (its cell's information plus a floor)."""
    model = _Model(ends, benign)
    weights = {cell: model.weight(cell) for cell in model.cell_rates}
    mean = sum(weights.values()) / max(1, len(weights))
    floor = WEIGHT_FLOOR * mean if mean > 0 else 1.0
    rng = random.Random(seed)
    units: dict[tuple[Any, ...], list[EndCase]] = defaultdict(list)
    for c in ends.cases:
        units[c.unit].append(c)
    first: list[tuple[Any, ...]] = []
    seen_seeds: set[int] = set()
    for c in sorted(ends.bad_signature_cases(), key=lambda c: (c.seed, *c.key)):
        if c.seed not in seen_seeds:
            seen_seeds.add(c.seed)
            if c.unit not in first:
                first.append(c.unit)
    rest = [u for u in units if u not in first]
    keyed = [(-math.log(1.0 - rng.random())
              / sum(weights[cell_of(c)] + floor for c in units[u]), i)
             for i, u in enumerate(rest)]
    order = first + [rest[i] for _, i in sorted(keyed)]
    return ([tuple(sorted(units[u], key=lambda c: c.position)) for u in order], len(first))


def condition_groups(n: int, level: int) -> list[int]:
    """The concurrency group of each of a level's `n` requests, by their place in its
    submission order: windows of `level` consecutive requests (what the fixed probe has in
    flight at once), a shorter remainder joining the last window so no group is sent with
    fewer in flight than the level asks (the fixed probe's tail also ran beside the window
    before it)."""
    if level < 1:
        raise ValueError("level must be >= 1")
    windows = max(1, n // level)
    return [min(p // level, windows - 1) for p in range(n)]


@dataclass
class SequentialTrial:
    """The test for one trial: feed it the drift figures, then the answers of each batch it
    asks for, until `decision` is not None. Deterministic given `seed`."""

    ends: TrialEnds
    false_fail: float
    false_pass: float
    seed: int = 0
    batch: int = DEFAULT_BATCH
    benign: float = BENIGN_FLIP_RATE
    # the bisect's trial policy: how a drift WARN counts where the ends differ only by drift
    # (there the bad end only drifts), and whether drift is judged against the ends (above)
    policy: TrialPolicy = DEFAULT_POLICY
    _units: list[tuple[EndCase, ...]] = field(init=False, repr=False)
    _model: _Model = field(init=False, repr=False)
    _next: int = field(default=0, init=False)  # accuracy requests sent
    _next_unit: int = field(default=0, init=False)
    _log_lr: float = field(default=0.0, init=False)
    _losses: int = field(default=0, init=False)
    _gains: int = field(default=0, init=False)
    _sig_seeds: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set), init=False)
    _drift: DriftFigures | None = field(default=None, init=False)
    _done: Decision | None = field(default=None, init=False)
    _reasons: list[str] = field(default_factory=list, init=False)
    _pending: set[tuple[str, str, int]] = field(default_factory=set, init=False)
    _tokens: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.lower, self.upper = wald_thresholds(self.false_fail, self.false_pass)
        if self.batch < 1:
            raise ValueError("batch must be >= 1")
        self._units, leading = draw_units(self.ends, self.seed, self.benign)
        self._model = _Model(self.ends, self.benign)
        self._by_key = {c.key: c for c in self.ends.cases}
        k = self.ends.counts()
        self._sig_suspended = _signature_seeds_count(
            (c for c in self.ends.cases if c.stable_right),
            lambda c: set(c.repeat_signatures) - set(c.good_signatures)) >= V.HARD_SIGNATURE_SEEDS
        self._differs = self.ends.accuracy_differs()
        # The bad end failed the signature rule (>= 2 seeds where the good end was stably
        # right): it lost facts, so facts decide the trial even where its accuracy loss alone
        # is too small to differ at the trial's size (a false EOS cutting 3 of 36 answers).
        self._sig_differs = not self._sig_suspended and _signature_seeds_count(
            self.ends.bad_signature_cases(), lambda c: True) >= V.HARD_SIGNATURE_SEEDS
        if not self._differs:  # only hard signatures can still speak: ask their cases alone
            self._units = self._units[:leading]
        self._reasons.append(
            f"ends at full size: the bad end lost {k['b']} and gained {k['c']} of {k['n']} "
            f"paired answers (good end right in {k['good_right']})"
            + ("" if self.ends.has_repeat else "; no A/A repeat: the noise floor is the "
               f"benign {self.benign:.0%} flip rate"))

    # -- the protocol --------------------------------------------------------------------------
    @property
    def cap(self) -> int:
        return sum(len(u) for u in self._units)

    @property
    def decision(self) -> Decision | None:
        return self._done

    def observe_drift(self, drift: DriftFigures) -> Decision | None:
        """Step 1: the trial's drift (every drift transcript scored). May decide at once."""
        if self._drift is not None:
            raise ValueError("drift already observed")
        self._drift = drift
        bad = self.ends.bad_drift
        where = f" ({drift.where})" if drift.where else ""
        share = drift.share_of(bad)
        shown = "?" if share is None else f"{share:.0%}"
        kl_share = drift.share_of(bad, kl_only=True)
        nearer_good = (self.policy.drift_relative and kl_share is not None
                       and kl_share < DRIFT_LIKE_BAD)
        if nearer_good:
            shown = f"{kl_share:.0%} (mean KL)"
        if drift.status == "fail" and not nearer_good:
            return self._decide(V.FAIL, "drift", f"drift FAIL{where} in the trial: like the bad "
                                               "end or worse")
        bad_drift_differs = _DRIFT_RANK[bad.status] > 0
        if not self._differs and not self._sig_differs and bad_drift_differs:
            if drift.status == "absent":
                return self._decide(V.BETWEEN, "drift", "the ends differ only by drift and the "
                                                      "trial has no drift measurement")
            if nearer_good:
                return self._decide(V.PASS, "drift", f"the ends differ only by drift; the trial's "
                                    f"drift ({drift.status}{where}) is {shown} of the bad end's: "
                                    "nearer the good end (--drift relative)")
            if not self.policy.warn_fails(bad_end_only_drifts=True):  # only a drift FAIL fails
                return self._decide(V.PASS, "drift", f"the ends differ only by drift; the trial's "
                                    f"drift is {drift.status.upper()}{where}, which counts as "
                                    "PASS (--warn-as pass)")
            if drift.status != "pass" and share is not None and share >= DRIFT_LIKE_BAD:
                return self._decide(V.FAIL, "drift", f"the ends differ only by drift; the "
                                    f"trial's drift is {drift.status}{where}, {shown} of the bad "
                                    f"end's ({bad.status}, {bad.where})")
            if drift.status == "pass" and (share is None or share < DRIFT_LIKE_BAD):
                return self._decide(V.PASS, "drift", "the ends differ only by drift; the trial's "
                                    f"drift passes ({shown} of the bad end's {bad.status})")
            return self._decide(V.BETWEEN, "drift", f"the ends differ only by drift; the trial's "
                                f"drift ({drift.status}{where}, {shown} of the bad end's) is "
                                f"between the ends")
        if not self._differs and not self.ends.bad_signature_cases():
            return self._decide(V.BETWEEN, "ends", "the ends do not differ in accuracy, drift or "
                                                 "hard signatures: no trial can be told apart")
        if drift.status in ("warn", "fail"):  # a FAIL here is nearer the good end's drift
            self._reasons.append(f"trial drift {drift.status.upper()}{where}"
                                 + (f", {shown} of the bad end's (--drift relative)"
                                    if nearer_good else "")
                                 + ("; accuracy decides" if self._differs
                                    else "; the bad end's hard signatures decide"))
        return None

    def next_units(self) -> list[tuple[EndCase, ...]]:
        """The next accuracy requests to send, as units (a request alone, or a concurrency
        group to send together with its level in flight, in its order): whole units until
        the batch holds `batch` requests; empty once decided or at the cap."""
        if self._drift is None:
            raise ValueError("observe the trial's drift first")
        if self._done is not None or self._pending:
            return []
        out: list[tuple[EndCase, ...]] = []
        while self._next_unit < len(self._units) and sum(map(len, out)) < self.batch:
            out.append(self._units[self._next_unit])
            self._next_unit += 1
        if not out:  # no accuracy case at all
            self._after_batch()
            return []
        cases = [c for u in out for c in u]
        self._next += len(cases)
        self._tokens += sum(c.prompt_tokens for c in cases)
        self._pending = {c.key for c in cases}
        return out

    def next_batch(self) -> list[EndCase]:
        """The requests of `next_units`, in order."""
        return [c for u in self.next_units() for c in u]

    def observe(self, key: tuple[str, str, int], right: bool,
                signatures: Sequence[str] = ()) -> Decision | None:
        """One answer of the current batch; after the batch's last answer the test may decide."""
        if key not in self._pending:
            raise ValueError(f"request {key} was not asked for in this batch")
        self._pending.discard(key)
        case = self._by_key[key]
        cell = cell_of(case)
        event = (not right) if case.good_right else right
        p_bad, p_good = self._model.predict(cell, case.good_right)
        self._log_lr += (math.log(p_bad / p_good) if event
                         else math.log((1.0 - p_bad) / (1.0 - p_good)))
        self._model.add(cell, case.good_right, event)
        self._losses += case.good_right and event
        self._gains += (not case.good_right) and event
        if case.stable_right:
            for sig in set(signatures) - set(case.good_signatures):
                self._sig_seeds[sig].add(case.seed)
        return None if self._pending else self._after_batch()

    # -- deciding ------------------------------------------------------------------------------
    def _after_batch(self) -> Decision | None:
        seeds = {s for v in self._sig_seeds.values() for s in v}
        if len(seeds) >= V.HARD_SIGNATURE_SEEDS and not self._sig_suspended:
            names = ", ".join(f"{k} (seeds {', '.join(map(str, sorted(v)[:4]))})"
                              for k, v in sorted(self._sig_seeds.items()))
            return self._decide(V.FAIL, "signatures", f"hard signatures where the good end was "
                                                    f"right: {names}")
        if self._differs:
            if self._log_lr >= self.upper:
                return self._decide(V.FAIL, "accuracy", self._accuracy_reason(LIKE_BAD))
            if self._log_lr <= self.lower:
                return self._decide(V.PASS, "accuracy", self._accuracy_reason(LIKE_GOOD))
        if self._next_unit >= len(self._units) and self._sig_differs and not seeds:
            # Every unit asked, the bad end's signature cases first: where the bad end lost
            # facts as hard signatures and none came back, the trial is like good even when
            # the accuracy test alone stays inside its bounds (a false EOS cutting 6 of 72)
            asked = ("its signature cases' units (one case per seed)" if not self._differs
                     else "the tier, its signature cases first")
            return self._decide(V.PASS, "signatures", "the bad end lost facts as hard "
                                f"signatures; the trial answered all {self._next} requests of "
                                f"{asked} without one")
        if self._next_unit >= len(self._units):
            what = ("every accuracy request of the tier" if self._differs
                    else "the bad end's hard-signature cases")
            return self._decide(V.BETWEEN, "cap", f"no decision after {what} "
                                f"({self.cap}): log LR {self._log_lr:.2f} inside "
                                f"({self.lower:.2f}, {self.upper:.2f}); evidence for neither "
                                "end")
        return None

    def _accuracy_reason(self, outcome: str) -> str:
        return (f"{outcome}: lost {self._losses}, gained {self._gains} in {self._next} paired "
                f"answers; log LR(bad : good) {self._log_lr:.2f} "
                f"{'>=' if outcome == LIKE_BAD else '<='} "
                f"{self.upper if outcome == LIKE_BAD else self.lower:.2f} (false FAIL "
                f"{self.false_fail:g}, false PASS {self.false_pass:g})")

    def decide_non_finite(self, cases: Sequence[str]) -> Decision:
        """The trial's server scored drift transcripts with NaN/±inf logprobs: a FAIL with the
        `non_finite` hard signature, whatever else it measured (sglang#25704)."""
        return self._decide(V.FAIL, "signatures", non_finite_reason("the trial", cases))

    def _decide(self, verdict: str, by: str, reason: str) -> Decision:
        scored = self._drift is not None and self._drift.status != "absent"
        drift_n = self.ends.drift_requests if scored else 0
        self._done = Decision(
            verdict, by, drift_n + self._next, self._next, drift_n, self.cap,
            self.false_fail, self.false_pass, self._log_lr, (self.lower, self.upper),
            self._losses, self._gains, (reason, *self._reasons), self._drift,
            self._tokens + (self.ends.drift_tokens if scored else 0))
        return self._done


def ends_from_runs(base: ProbeRun, bad: ProbeRun, repeat: ProbeRun | None) -> TrialEnds:
    """The ends as measured: the good end's baseline, the bad end, the A/A repeat (or None).
    Rows pair by (case_id, arm, concurrency) as in the fixed verdict; drift is
    judge.drift_check's. Every accuracy row both ends have is a trial case, with the condition
    it was measured in: a row at concurrency c > 1 carries its place in the level's submission
    order and its concurrency group (`condition_groups`), so the trial replays it with the same
    batch mates in the same order."""
    from dsv4bisect.probe.judge import drift_check

    bad_rows, rep_rows = bad.rows_by_key(), repeat.rows_by_key() if repeat else {}
    place = _level_places(base)
    cases: list[EndCase] = []
    for key, row in base.rows_by_key().items():
        other = bad_rows.get(key)
        if row["family"] == "drift" or other is None:
            continue
        rep = rep_rows.get(key)
        level = key[2]
        if level > 1 and key not in place:
            raise ConfigError(f"the baseline's request {key} is not one its probe spec sends "
                              f"at concurrency {level}",
                              "probe the ends with the spec and cases of one baseline")
        position, group = place.get(key, (0, 0))
        cases.append(EndCase(
            row["case_id"], row["arm"], row["cell"], row["family"], int(row["length"]),
            int(row.get("prompt_tokens") or row["length"]), int(row["seed"]),
            bool(row["correct"]), bool(other["correct"]),
            None if rep is None else bool(rep["correct"]),
            tuple(row.get("signatures") or ()), tuple(other.get("signatures") or ()),
            tuple(rep.get("signatures") or ()) if rep else (), level, group, position))
    drift = [d for d in base.drift]
    return TrialEnds(tuple(cases), DriftFigures.of(drift_check(base, repeat, bad)),
                     len(drift), sum(len(d.input_ids) for d in drift), repeat is not None)


def _level_places(run: ProbeRun) -> dict[tuple[str, str, int], tuple[int, int]]:
    """(place in its level's submission order, concurrency group) of every request the fixed
    probe sent at a level above 1, from the run's spec and cases (`tasks.tasks_of`,
    `tasks.submission_order`: the order the baseline, its repeat and the bad end all used).
    A run without its cases (rows alone) keeps its rows' order."""
    from dsv4bisect.probe.run import row_key
    from dsv4bisect.probe.tasks import submission_order, tasks_of

    spec = run.spec
    every = tasks_of(spec, list(run.cases))
    out: dict[tuple[str, str, int], tuple[int, int]] = {}
    for level in spec.concurrency:
        if level == 1:
            continue
        if run.cases:
            full = [(c.case_id, arm, lv) for c, arm, lv in every
                    if lv == level and arm in spec.arms]
            sent = [full[k] for k in submission_order(spec, level, len(full))]
        else:
            sent = [k for k in map(row_key, run.rows) if k[2] == level and k[1] in spec.arms]
        groups = condition_groups(len(sent), level)
        out |= {key: (p, groups[p]) for p, key in enumerate(sent)}
    return out


def cell_of(case: EndCase) -> CellKey:
    return (case.cell, case.arm, case.concurrency)


def _signature_seeds_count(cases: Iterable[EndCase], sigs: Any) -> int:
    return len({c.seed for c in cases if sigs(c)})


def run_offline(test: SequentialTrial, drift: DriftFigures,
                answer: Mapping[tuple[str, str, int], tuple[bool, Sequence[str]]]) -> Decision:
    """Drive `test` to its decision from answers known in advance (simulation, tests)."""
    got = test.observe_drift(drift)
    while got is None:
        batch = test.next_batch()
        if not batch:
            got = test.decision
        for case in batch:
            right, sigs = answer[case.key]
            got = test.observe(case.key, right, sigs) or got
    return got
