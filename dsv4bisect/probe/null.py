"""The null model: the good end's own drift under harmless changes a deployment makes to itself.

A server re-chunks a prompt's prefill, gives a request other batch mates and another order, and
serves a prefix from its cache or computes it, whenever its load changes; on a GPU each of these
moves the logits (batch-size-dependent kernel dispatch: docs/reference-engine.md). The baseline
run therefore scores its drift transcripts again in two arms, from requests alone (no
relaunch, so it works on any SGLang server; `probe/runner.py`):

- `drift-concurrent`: every transcript at once, in a shuffled order, after one cache flush: other
  batch mates, another token count per forward, so another prefill chunking and kernel dispatch;
- `drift-rechunk`: each transcript re-chunked at a quarter, half and three quarters of its
  scored window, as a server chunks it when that prefix was a request of its own (an earlier
  turn, a prefix sent first): the prefix alone, scored, in forwards of its own token count;
  then the transcript, the prefix a prefix-cache hit and the rest prefilled from the split.
  Every position is compared, before the split as the prefix request computed it, after it as
  the rest did, so each position is computed in a forward of another token count than the
  baseline's and takes the kernel dispatch that count picks (reference/dispatch.py), as a
  prefill chunked elsewhere does. (Its first version, `drift-warm`, compared only the positions
  after the split: a prefix's positions never met another dispatch, and a `--chunk-size 512`
  server WARNed in the buckets below the first split, docs/probe.md.)

Each is compared with the baseline's cold scores position by position (`drift.compare`); the pool
of those comparisons is the null. A candidate's drift is then a multiple of it, and WARNs where a
harmless change would land with probability below `FALSE_ALARM` (docs/probe.md, "The null model"
derives the gate): per view (all positions, each position bucket with enough positions), three
statistics — mean KL, the share of positions above the null's own 99th-percentile KL (the tail),
and the share whose top-1 differs — each against the (1 - FALSE_ALARM / tests) quantile of its
sampling distribution under the null: a two-sample block bootstrap (neighbouring positions share
a context, so blocks of `BLOCK` positions resample together) draws a candidate of the
candidate's size and a null of the null's size from the null's pool and compares the two (the
differences of their mean KLs and shares), so the gate holds the null's own uncertainty.

Pure and stdlib-only; deterministic (the bootstrap's seed is fixed).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsv4bisect.probe.drift import DriftComparison, DriftRecord, bucket_of, compare, percentile

CONCURRENT_ARM, RECHUNK_ARM = "drift-concurrent", "drift-rechunk"
NULL_ARMS = (CONCURRENT_ARM, RECHUNK_ARM)
FALSE_ALARM = 0.01  # a harmless change WARNs in at most 1 run in 100 (all views and statistics)
BLOCK = 64  # positions resampled together (a block shares its context)
BOOTSTRAP = 2000  # resamples; the quantile for 9 tests at 1 % is the 2000 · 0.0011 ≈ 2nd largest
TAIL_Q = 99.0  # the null's own percentile that defines a tail position
ALL = "all positions"
ANSWER = "answer positions"  # the baseline's answer tokens: where a lost fact shows first
ANSWER_MIN = 32  # positions; fewer (a tier with one short answer) and the view is left out


@dataclass(frozen=True)
class _Block:
    n: int
    kl: float  # sum
    tail: int  # positions above the tail threshold
    differ: int  # positions whose top-1 differs


@dataclass(frozen=True)
class NullView:
    """The null in one view: its figures, their 95 % interval, and the WARN gates for a
    candidate of `n_candidate` positions."""

    where: str
    n: int  # null positions pooled over the arms
    kl_mean: float
    kl_mean_ci: tuple[float, float]
    kl_p99: float  # the tail threshold: a candidate position above it is a tail position
    top1_agreement: float
    n_candidate: int
    warn_kl: float  # the candidate's mean KL WARNs above this
    warn_tail: float  # ... its share of positions above kl_p99
    warn_top1: float  # ... its top-1 agreement below this

    @property
    def warn_multiple(self) -> float | None:
        """The gate as a multiple of the null's mean KL (None: the null is exactly 0)."""
        return self.warn_kl / self.kl_mean if self.kl_mean > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "n": self.n, "kl_mean": self.kl_mean,
                "kl_mean_ci": list(self.kl_mean_ci), "kl_p99": self.kl_p99,
                "top1_agreement": self.top1_agreement, "n_candidate": self.n_candidate,
                **self.gates()}

    def gates(self) -> dict[str, float | None]:
        """The gates as JSON: an infinite gate (a null whose bootstrap draws include a zero
        mean, so no multiple of it bounds the candidate) is None, as JSON has no Infinity."""
        return {k: v if v is None or math.isfinite(v) else None for k, v in (
            ("warn_kl", self.warn_kl), ("warn_tail", self.warn_tail),
            ("warn_top1", self.warn_top1), ("warn_multiple", self.warn_multiple))}


@dataclass(frozen=True)
class NullModel:
    arms: Mapping[str, int]  # arm -> positions it contributed
    views: Mapping[str, NullView]
    false_alarm: float
    tests: int  # views × 3 statistics: the false-alarm rate is split over them

    def to_dict(self) -> dict[str, Any]:
        return {"arms": dict(self.arms), "false_alarm": self.false_alarm, "tests": self.tests,
                "bootstrap": BOOTSTRAP, "block": BLOCK,
                "views": {k: v.to_dict() for k, v in self.views.items()}}


def null_comparisons(drift: Sequence[DriftRecord],
                     null: Sequence[tuple[str, DriftRecord]]) -> dict[str, list[DriftComparison]]:
    """Per null arm: the baseline's cold scores compared with the arm's."""
    ref = {d.case_id: d for d in drift}
    out: dict[str, list[DriftComparison]] = {}
    for arm, rec in null:
        if rec.case_id in ref:
            out.setdefault(arm, []).append(compare(ref[rec.case_id], rec))
    return out


def in_view(where: str, c: DriftComparison, pos: int) -> bool:
    """Whether position `pos` of comparison `c` belongs to the view `where`."""
    if where == ALL:
        return True
    if where == ANSWER:
        return c.answer_start is not None and pos >= c.answer_start
    return where == f"positions {bucket_of(pos)}"


def view_values(comps: Sequence[DriftComparison], where: str
                ) -> tuple[list[float], list[bool]]:
    """The per-position KL and top-1 agreement of a view, pooled over transcripts."""
    kl = [k for c in comps for p, k in zip(c.positions, c.kl) if in_view(where, c, p)]
    same = [s for c in comps for p, s in zip(c.positions, c.top1_same) if in_view(where, c, p)]
    return kl, same


def build(by_arm: Mapping[str, Sequence[DriftComparison]], candidate_sizes: Mapping[str, int],
          *, false_alarm: float = FALSE_ALARM, seed: int = 0) -> NullModel | None:
    """The null over the views a candidate is judged in (`candidate_sizes`: view -> the
    candidate's positions there). None when no null arm scored anything."""
    pooled = [c for comps in by_arm.values() for c in comps]
    if not any(c.kl for c in pooled):
        return None
    tests = 3 * len(candidate_sizes)
    q = 1.0 - false_alarm / tests
    views = {}
    for where, n_cand in candidate_sizes.items():
        kl, same = view_values(pooled, where)
        if not kl:
            continue
        threshold = percentile(kl, TAIL_Q)
        blocks = _blocks(pooled, where, threshold)
        rng = random.Random(f"null:{seed}:{where}")
        null_means, null_tails, null_differs = _bootstrap(blocks, len(kl), rng)
        means, tails, differs = _bootstrap(blocks, n_cand, rng)
        mean, differ = sum(kl) / len(kl), 1.0 - sum(same) / len(same)
        tail = sum(k > threshold for k in kl) / len(kl)
        # Two samples of one distribution: the candidate's statistic against the null's, each
        # drawn at its own size, so the gate carries the null's own uncertainty too (as a
        # difference: a ratio is undefined where a resampled null is exactly 0).
        views[where] = NullView(
            where, len(kl), mean,
            (_quantile(null_means, 0.025), _quantile(null_means, 0.975)), threshold,
            1.0 - differ, n_cand,
            mean + max(0.0, _quantile([a - b for a, b in zip(means, null_means)], q)),
            tail + _quantile([a - b for a, b in zip(tails, null_tails)], q),
            1.0 - differ - _quantile([a - b for a, b in zip(differs, null_differs)], q))
    arms = {arm: sum(len(c.kl) for c in comps) for arm, comps in by_arm.items()}
    return NullModel(arms, views, false_alarm, tests)


def _blocks(pooled: Sequence[DriftComparison], where: str, threshold: float) -> list[_Block]:
    """Consecutive scored positions of one transcript in one view, BLOCK at a time."""
    out = []
    for c in pooled:
        rows = [(k, s) for p, k, s in zip(c.positions, c.kl, c.top1_same)
                if in_view(where, c, p)]
        for i in range(0, len(rows), BLOCK):
            part = rows[i:i + BLOCK]
            out.append(_Block(len(part), sum(k for k, _ in part),
                              sum(k > threshold for k, _ in part), sum(not s for _, s in part)))
    return out


def _bootstrap(blocks: Sequence[_Block], n: int, rng: random.Random
               ) -> tuple[list[float], list[float], list[float]]:
    """BOOTSTRAP draws of (mean KL, tail share, top-1 disagreement) over about n positions."""
    means, tails, differs = [], [], []
    for _ in range(BOOTSTRAP):
        got, kl, tail, differ = 0, 0.0, 0, 0
        while got < n:
            b = blocks[rng.randrange(len(blocks))]
            got, kl, tail, differ = got + b.n, kl + b.kl, tail + b.tail, differ + b.differ
        means.append(kl / got)
        tails.append(tail / got)
        differs.append(differ / got)
    return means, tails, differs


def _quantile(values: Sequence[float], q: float) -> float:
    return percentile(values, 100.0 * q)


_TINY = 1e-300  # a gate of exactly 0 (an exact-zero null): any drift is past it


def judge_view(view: NullView, kl: Sequence[float], same: Sequence[bool]) -> dict[str, Any]:
    """The candidate in one view against the null: its figures, multiple and status."""
    n = len(kl)
    mean = sum(kl) / n
    tail = sum(k > view.kl_p99 for k in kl) / n
    top1 = sum(same) / n
    warn = mean > view.warn_kl or tail > view.warn_tail or top1 < view.warn_top1
    return {"status": "warn" if warn else "pass", "where": view.where, "kl_mean": mean,
            "tail_share": tail, "top1_agreement": top1, "multiple": multiple(mean, view.kl_mean),
            "gates": view.gates(),
            # how far past its gates, so the trigger names the clearest view
            "severity": max(mean / max(view.warn_kl, _TINY),
                            tail / view.warn_tail if view.warn_tail > 0 else 0.0,
                            (1 - top1) / (1 - view.warn_top1) if view.warn_top1 < 1 else 0.0)}


def multiple(value: float, null: float) -> float | None:
    """value as a multiple of the null (None: the null is exactly 0 and value is not)."""
    if null > 0:
        return value / null
    return 0.0 if value == 0 else None


def says(m: float | None) -> str:
    """'×6.2 the deployment's own variation' (or what an exact-zero null means)."""
    if m is None:
        return "above a deployment whose own variation is exactly 0"
    return f"×{m:.3g} the deployment's own variation"
