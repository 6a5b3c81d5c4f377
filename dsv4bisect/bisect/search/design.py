"""Choosing the next subsets: expected information per launch, constructed greedily.

The subset space is 2^n, so subsets are built, not enumerated: starting from a few seeds, add
the candidate that most raises the mutual information between the round's outcomes and the
hypothesis, until no addition helps; then try one-element removals. For a round of K parallel
launches the k-th subset maximises the *joint* information of all K outcomes, so the subsets of
one round ask different questions.

Outcomes of a round are indexed by a bit pattern p = Σ_j bit_j · 2^j (bit j = test j fails).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np

from dsv4bisect.bisect.search.hypotheses import HypothesisSpace
from dsv4bisect.errors import BisectError

_TIE = 1e-6  # bits; smaller differences are ties (broken by candidate order), so candidates
# that are already ruled out (posterior ~1e-6, not 0: see search._FLOOR) are not added
_COIN = np.array([0.5, 0.5])
CREDIT_INFO_SHARE = 0.9  # see RoundDesign.choose


@dataclass(frozen=True)
class Noise:
    """Probe error rates: `false_fail` = P(FAIL | config truly good), `false_pass` =
    P(PASS | config truly bad). Measured from A/A runs and re-tests, or given."""

    false_fail: float = 0.0
    false_pass: float = 0.0

    def validate(self) -> Noise:
        """Itself, or a BisectError with a hint: each rate in [0, 1), and together below 1
        (else a FAIL says nothing about the configuration)."""
        for name, rate in (("false-fail", self.false_fail), ("false-pass", self.false_pass)):
            if not 0 <= rate < 1:
                raise BisectError(f"{name} rate {rate} is outside [0, 1)", "e.g. 0.05")
        if self.false_fail + self.false_pass >= 1:
            raise BisectError(
                "the probe cannot tell good from bad at these error rates",
                "false-fail + false-pass must be below 1; use a stronger probe tier",
            )
        return self

    def channel(self) -> np.ndarray:
        """[observed, true] with 0 = pass, 1 = fail."""
        a, b = self.false_fail, self.false_pass
        return np.array([[1 - a, b], [a, 1 - b]])


DEFAULT_NOISE = Noise(0.05, 0.05)  # a probe's error rates when none were measured or given


def entropy(p: np.ndarray) -> np.ndarray:
    """Entropy in bits along the last axis."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(np.where(p > 0, p, 1.0)), 0.0)
    return terms.sum(axis=-1)


def binary_entropy(p: np.ndarray) -> np.ndarray:
    """Entropy in bits of Bernoulli(p), elementwise."""
    p = np.minimum(np.maximum(p, 1e-300), 1.0)  # sums of probabilities can round past 1
    q = np.maximum(1.0 - p, 1e-300)
    return -(p * np.log2(p) + q * np.log2(q))


def _vec_entropy(v: np.ndarray) -> float:
    return 1.0 if v is _COIN else float(binary_entropy(np.array(v[1])))


class RoundDesign:
    """Greedy construction of up to K jointly informative subsets.

    `post`: [H + 3] posterior (culprit sets, then good-end-fails, bad-end-passes, unexplained).
    """

    def __init__(self, space: HypothesisSpace, post: np.ndarray, noise: Noise) -> None:
        self.space = space
        self.noise = noise
        self.channel = noise.channel()
        self.set_mass = post[: space.n_sets]
        self.set_mass_total = float(self.set_mass.sum())
        self.members_f = space.members_f  # [H, n]
        self.members_t = space.members_t  # [n, H], contiguous for the products above
        self.p_all, self.p_none, self.p_other = (float(v) for v in post[space.n_sets :])
        self.h_pass, self.h_fail = entropy(self.channel.T)  # H(O | truly passes / fails)
        self.pattern = np.zeros(space.n_sets, dtype=np.int64)  # [H] bits of the chosen tests
        self.other: list[np.ndarray] = []  # per chosen test: P(observed) under `unexplained`
        self.cond = 0.0  # Σ_tests E[H(O_j | hypothesis)]
        self.tests: list[np.ndarray] = []
        self._memo: dict[bytes, float] = {}

    # -- information of the round plus one more test -------------------------------------------
    def _info(self, fail_by_pattern: np.ndarray, other_vec: np.ndarray) -> np.ndarray:
        """Joint information for candidate next tests.

        fail_by_pattern: [C, P] culprit-set mass that truly fails the new test, per earlier
        pattern (P = 2^k for k earlier tests). Returns [C] bits.
        """
        k = len(self.tests)
        if k == 0:
            return self._info_single(fail_by_pattern[:, 0], other_vec)
        total = np.bincount(self.pattern, weights=self.set_mass, minlength=1 << k)  # [P]
        true = np.stack([total[None, :] - fail_by_pattern, fail_by_pattern], axis=1)  # [C,2,P]
        true[:, 0, 0] += self.p_none
        true[:, 1, (1 << k) - 1] += self.p_all
        obs = true.reshape(len(true), *([2] * (k + 1)))
        for axis in range(1, k + 2):  # the same channel on every test's outcome
            obs = np.moveaxis(np.tensordot(obs, self.channel, axes=([axis], [1])), -1, axis)
        obs = obs.reshape(len(true), -1)
        other = reduce(np.kron, [other_vec, *reversed(self.other)])  # [2^(k+1)]
        obs = obs + self.p_other * other[None, :]
        fail = fail_by_pattern.sum(axis=1) + self.p_all
        struct = self.set_mass.sum() + self.p_all + self.p_none
        cond = self.cond + fail * self.h_fail + (struct - fail) * self.h_pass
        cond = cond + self.p_other * float(entropy(other_vec))
        return entropy(obs) - cond

    def _info_single(self, fail: np.ndarray, other_vec: np.ndarray) -> np.ndarray:
        """`_info` for the first test of a round: [C] true-fail masses of the culprit sets ->
        [C] bits. With T the mass that is not `unexplained` and F = fail + P(good end fails):
        P(observed FAIL) = a·(T - F) + b·F + P(unexplained)·other[1], and the conditional
        entropy is F·H(O|fails) + (T - F)·H(O|passes) + P(unexplained)·H(other)."""
        a, b = self.channel[1]  # P(observed FAIL | truly passes), P(observed FAIL | fails)
        total = self.set_mass_total + self.p_all + self.p_none
        f = fail + self.p_all
        p_fail = (a * total + self.p_other * other_vec[1]) + (b - a) * f
        cond = (total * self.h_pass + self.p_other * _vec_entropy(other_vec)) + (
            self.h_fail - self.h_pass
        ) * f
        return binary_entropy(p_fail) - cond

    def _other_vec(self, mask: np.ndarray) -> np.ndarray:
        if not mask.any():
            return self.channel[:, 0]
        if mask.all():
            return self.channel[:, 1]
        return _COIN

    def info_of(self, mask: np.ndarray) -> float:
        """Joint information of the chosen tests plus `mask` (memoised per round state)."""
        key = mask.tobytes()
        if key not in self._memo:
            inside = self.space.contained(mask)
            fail = np.bincount(
                self.pattern[inside], weights=self.set_mass[inside], minlength=1 << len(self.tests)
            )
            self._memo[key] = float(self._info(fail[None, :], self._other_vec(mask))[0])
        return self._memo[key]

    # -- greedy construction -------------------------------------------------------------------
    def _by_pattern(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mass of the culprit sets in `rows` ([H] bool) per earlier pattern [P], and per
        candidate member and pattern [n, P]."""
        mass = np.where(rows, self.set_mass, 0.0)  # [H]; dense products beat row selection
        if not self.tests:
            return np.array([mass.sum()]), (self.members_t @ mass)[:, None]
        weights = np.zeros((len(mass), 1 << len(self.tests)))
        weights[np.arange(len(mass)), self.pattern] = mass
        return weights.sum(axis=0), self.members_t @ weights

    def p_fail(self, mask: np.ndarray) -> float:
        """P(a trial of `mask` truly fails) under the posterior (`unexplained`: a coin between
        the ends)."""
        inside = float(self.set_mass[self.space.contained(mask)].sum()) + self.p_all
        other = 0.0 if not mask.any() else 1.0 if mask.all() else 0.5
        total = self.set_mass_total + self.p_all + self.p_none + self.p_other
        return min(max((inside + self.p_other * other) / max(total, 1e-300), 0.0), 1.0)

    def grow(self, start: np.ndarray, frozen: np.ndarray | None = None) -> np.ndarray:
        """Add candidates one at a time while the joint information rises; then drop any whose
        removal raises it. Candidates marked in `frozen` keep their state in `start` (a
        construction inside one engine: its load-time candidates cannot change)."""
        fixed = np.zeros(len(start), bool) if frozen is None else frozen.astype(bool)
        mask = start.copy()
        out = self.space.sizes - self.members_f @ mask  # [H] members outside the subset
        best = self.info_of(mask)
        while not mask.all():
            base, _ = self._by_pattern(out == 0)
            _, gain = self._by_pattern(out == 1)  # one member short: in once it is added
            info = self._info(base[None, :] + gain, _COIN)
            info[mask.astype(bool) | fixed] = -np.inf
            top = float(info.max())
            if top <= best + _TIE:
                break
            x = int(np.flatnonzero(info >= top - _TIE)[0])
            mask[x] = 1
            out -= self.members_f[:, x]
            best = top
        return self._prune(mask, best, fixed)

    def _prune(self, mask: np.ndarray, best: float, fixed: np.ndarray) -> np.ndarray:
        """Drop members one at a time while that raises the joint information."""
        while mask.sum() > 1:
            base, loss = self._by_pattern(self.space.contained(mask))
            info = self._info(base[None, :] - loss, _COIN)
            info[~mask.astype(bool) | fixed] = -np.inf
            top = float(info.max())
            if top <= best + _TIE:
                break
            x = int(np.flatnonzero(info >= top - _TIE)[0])
            mask = mask.copy()
            mask[x] = 0
            best = top
        return mask

    def choose(self, options: Sequence[np.ndarray], avoid: set[bytes],
               price: Callable[[np.ndarray], tuple[float, float]] | None = None
               ) -> np.ndarray | None:
        """The most informative option not in `avoid` (first wins ties); None if none informs.
        With `price` (mask -> expected seconds of a trial of it, and the share of them it is
        credited as a trial the bisect runs anyway): the most information per second among the
        options that inform at all. The credit counts only for an option within
        `CREDIT_INFO_SHARE` of the best information: it decides between questions of nearly
        the same worth and never buys a much weaker one (greedy ratios would: a cheap weak test
        now costs more trials later)."""
        kept: list[tuple[np.ndarray, float]] = []
        seen: set[bytes] = set()
        for mask in options:
            key = mask.tobytes()
            if key in avoid or key in seen:
                continue
            seen.add(key)
            info = self.info_of(mask)
            if info > 2 * _TIE:
                kept.append((mask, info))
        if not kept:
            return None
        top = max(info for _, info in kept)
        best, best_score = None, 0.0
        for mask, info in kept:
            if price is None:
                better, score = best is None or info > best_score + _TIE, info
            else:
                seconds, credit = price(mask)
                if info < CREDIT_INFO_SHARE * top:
                    credit = 0.0
                score = info / max(seconds * (1 - credit), 1e-9)
                better = best is None or score > best_score * (1 + _TIE)
            if better:
                best, best_score = mask, score
        return best

    def commit(self, mask: np.ndarray) -> None:
        """Fix `mask` as the next test of this round."""
        bit = len(self.tests)
        inside = self.space.contained(mask)
        vec = self._other_vec(mask)
        fail = float(self.set_mass[inside].sum()) + self.p_all
        struct = self.set_mass.sum() + self.p_all + self.p_none
        self.cond += fail * self.h_fail + (struct - fail) * self.h_pass
        self.cond += self.p_other * float(entropy(vec))
        self.pattern |= inside.astype(np.int64) << bit
        self.other.append(vec)
        self.tests.append(mask.copy())
        self._memo.clear()


def capacity(noise: Noise) -> float:
    """Bits per test at best: the capacity of the probe's binary channel (1.0 when noiseless)."""
    channel = noise.channel()
    h_pass, h_fail = entropy(channel.T)
    p = np.linspace(0.0, 1.0, 2001)  # P(config truly fails)
    obs = np.stack([1 - p, p], axis=1) @ channel.T  # [grid, observed]
    return float((entropy(obs) - (p * h_fail + (1 - p) * h_pass)).max())


def flips(mask: np.ndarray) -> list[np.ndarray]:
    """The subsets that differ from `mask` in one candidate."""
    out = []
    for i in range(len(mask)):
        flipped = mask.copy()
        flipped[i] = 1 - flipped[i]
        out.append(flipped)
    return out


def information_bound(n_candidates: int, culprit_size: int, noise: Noise) -> float:
    """Trials any search needs, on average, to single out one culprit set of this size among
    n candidates: log2 C(n, size) bits at the probe's bits per trial (the report's yardstick)."""
    return math.log2(max(math.comb(n_candidates, culprit_size), 1)) / capacity(noise)
