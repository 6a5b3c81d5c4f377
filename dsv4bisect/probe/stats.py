"""Exact small-sample statistics for paired probe outcomes (stdlib only).

Paired design: every case runs on the baseline and on the candidate. Of the discordant pairs,
`b` = baseline right and candidate wrong, `c` = the reverse. Under H0 (the candidate is no worse)
each discordant pair is a fair coin, so the exact one-sided McNemar p-value is P(X >= b) with
X ~ Binomial(b + c, 1/2). Symmetric noise (batching, radix cache) adds to b and c alike and
cancels by construction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def _log_pmf(i: int, n: int, p: float) -> float:
    return (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
            + i * math.log(p) + (n - i) * math.log1p(-p))


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p); sums the shorter tail in log space (any n)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    if n - k + 1 <= k:
        return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k, n + 1)))
    return max(0.0, 1.0 - sum(math.exp(_log_pmf(i, n, p)) for i in range(k)))


def mcnemar_one_sided(b: int, c: int) -> float:
    """Exact one-sided McNemar p-value for 'the candidate loses more than it gains'."""
    if b < 0 or c < 0:
        raise ValueError("discordant counts must be non-negative")
    n = b + c
    if n == 0:
        return 1.0
    # P(X >= b), X ~ Bin(n, 1/2): integer arithmetic, then one division (exact to the ulp).
    return sum(math.comb(n, i) for i in range(b, n + 1)) / 2**n


def mcnemar_two_sided(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value (twice the smaller tail, capped at 1)."""
    return min(1.0, 2.0 * min(mcnemar_one_sided(b, c), mcnemar_one_sided(c, b)))


def min_significant_discordant(alpha: float) -> int:
    """Smallest b with c = 0 that reaches p < alpha (p = 2^-b): 7 at alpha 0.01."""
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1)")
    return math.floor(math.log2(1.0 / alpha)) + 1


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjusted p-values, in the input order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (no continuity correction)."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= k <= n:
        raise ValueError("need 0 <= k <= n")
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half) if k else 0.0, min(1.0, centre + half) if k < n else 1.0)


def rule_of_three(n: int) -> float:
    """Approximate 95 % upper bound on a rate after 0 events in n trials: 3/n."""
    return 1.0 if n <= 0 else min(1.0, 3.0 / n)


def zero_event_bound(n: int, confidence: float = 0.95) -> float:
    """Exact one-sided upper bound after 0 events in n trials: 1 - (1-confidence)^(1/n)."""
    return 1.0 if n <= 0 else 1.0 - (1.0 - confidence) ** (1.0 / n)


def detection_probability(n: int, rate: float, threshold: int) -> float:
    """P(at least `threshold` of n independent cases fail) when each fails with `rate`."""
    return binom_sf(threshold, n, rate)


def min_detectable_rate(n: int, threshold: int, power: float = 0.95) -> float | None:
    """Smallest per-case failure rate q with P(Bin(n, q) >= threshold) >= power.

    None when even q = 1 cannot reach `threshold` (too few cases). Bisection on q: the tail
    probability is increasing in q.
    """
    if threshold <= 0:
        return 0.0
    if n < threshold:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if detection_probability(n, mid, threshold) >= power:
            hi = mid
        else:
            lo = mid
    return hi
