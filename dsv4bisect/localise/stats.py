"""Each site's A/A envelope and a run's multiple of it (the per-module analogue of the probe's
null model, docs/probe.md "The null model").

A site's **null** is the pool of per-position divergences the good end shows against itself
under the harmless changes a deployment makes (re-chunked prefill, other batch mates): the
null arms of `protocol.py`. A candidate run's statistic at the site is its mean per-position
divergence from the good end. Under H0 (the candidate's change is like a harmless one at this
site) its positions are drawn from the null; the **envelope** is the largest mean a harmless
change reaches there at the false-alarm rate: a two-sample block bootstrap (blocks of `BLOCK`
consecutive positions of one sequence, which share their context) draws a candidate of the
candidate's size and a null of the null's size, BOOTSTRAP times, and the gate is the null's
mean plus the (1 − α/m) quantile of their difference — α = `FALSE_ALARM` split over the m
sites compared (Bonferroni), as `probe/null.py` gates drift.

The envelope never goes below `FLOOR`: a relative change of a tensor below 2^-20 (≈ 9.5e-7,
16 fp32 ulps) is an fp32 reordering, which any harmless change produces somewhere (the CPU's
GEMM blocks by row count; the measured A/A at layer 0 of the shipped checkpoint is 1e-8–3e-7
per position) but a held-out arm may happen not to — an exact-zero null would otherwise make
an fp32 reordering infinitely many times its envelope.

`multiple` = the candidate's mean ÷ the envelope: outside the envelope above 1. Pure numpy,
deterministic (the bootstrap's seed is the site's key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dsv4bisect.localise.sites import Compared

FLOOR = 2.0 ** -20
FALSE_ALARM = 0.01
BOOTSTRAP = 2000
BLOCK = 64


@dataclass(frozen=True)
class Envelope:
    n: int  # null positions pooled over the arms
    mean: float  # the null's mean divergence
    peak: float  # its largest per-position divergence (at least FLOOR)
    bound: float  # the envelope: the largest harmless mean at the false-alarm rate (>= FLOOR)
    arms: tuple[str, ...]


@dataclass(frozen=True)
class Judged:
    """One site of a candidate run against its envelope."""

    n: int
    mean: float
    max: float
    multiple: float  # mean / envelope.bound
    envelope: Envelope
    outside: tuple[tuple[int, int], ...]  # (seq, position) past the null's peak, in order

    @property
    def is_outside(self) -> bool:
        return self.multiple > 1.0


def _blocks(comps: Sequence[Compared]) -> tuple[np.ndarray, np.ndarray]:
    """Per block of BLOCK consecutive positions of one sequence: its sum and count."""
    sums, counts = [], []
    for c in comps:
        for seq in np.unique(c.seqs):
            d = c.d[c.seqs == seq][np.argsort(c.positions[c.seqs == seq], kind="stable")]
            for i in range(0, len(d), BLOCK):
                part = d[i:i + BLOCK]
                sums.append(float(part.sum()))
                counts.append(len(part))
    return np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.int64)


def _draw_means(sums: np.ndarray, counts: np.ndarray, n: int, rng: np.random.Generator
                ) -> np.ndarray:
    """BOOTSTRAP means of about n positions: as many blocks as hold n positions on average."""
    k = max(1, round(n / float(counts.mean())))
    idx = rng.integers(0, len(sums), size=(BOOTSTRAP, k))
    return sums[idx].sum(axis=1) / counts[idx].sum(axis=1)


def envelope(key: str, null: Sequence[tuple[str, Compared]], n_candidate: int,
             tests: int, candidate_mean: float | None = None) -> Envelope:
    """The envelope of site `key` for a candidate of `n_candidate` positions, from the null
    arms' comparisons; `tests`: the sites judged in the run (the false-alarm rate's split).
    Given `candidate_mean` at or below the null's mean (or FLOOR), the candidate is inside
    whatever the bootstrap says, and the envelope is reported as that mean without one."""
    comps = [c for _, c in null if c is not None and len(c.d)]
    arms = tuple(dict.fromkeys(a for a, c in null if c is not None and len(c.d)))
    if not comps or n_candidate <= 0:
        return Envelope(0, 0.0, FLOOR, FLOOR, arms)
    pooled = np.concatenate([c.d for c in comps])
    mean = float(pooled.mean())
    peak = max(FLOOR, float(pooled.max()))
    if candidate_mean is not None and candidate_mean <= max(mean, FLOOR):
        # inside whatever the gate is (it is at least the null's mean and FLOOR): no bootstrap
        return Envelope(len(pooled), mean, peak, max(FLOOR, mean), arms)
    sums, counts = _blocks(comps)
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    cand = _draw_means(sums, counts, n_candidate, rng)
    base = _draw_means(sums, counts, len(pooled), rng)
    q = 1.0 - FALSE_ALARM / max(1, tests)
    gate = mean + max(0.0, float(np.quantile(cand - base, q)))
    return Envelope(len(pooled), mean, peak, max(FLOOR, gate), arms)


def judge(c: Compared, env: Envelope, first: int = 8) -> Judged:
    """The candidate's comparison at one site against its envelope; `outside` lists up to
    `first` (sequence, position) pairs past anything the null showed there (its peak)."""
    mean = float(c.d.mean()) if len(c.d) else 0.0
    top = float(c.d.max()) if len(c.d) else 0.0
    over = c.d > env.peak
    order = np.lexsort((c.positions[over], c.seqs[over]))
    pairs = tuple((int(s), int(p)) for s, p in
                  zip(c.seqs[over][order][:first], c.positions[over][order][:first],
                      strict=True))
    return Judged(len(c.d), mean, top, mean / env.bound, env, pairs)
