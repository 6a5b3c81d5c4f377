"""The hypothesis space of the search: culprit sets up to `max_order`, plus three catch-alls.

A culprit set h explains the failure under the monotone model: a configuration S (the set of
candidate patches switched to their bad-end state) truly fails iff h ⊆ S. The catch-alls cover
what no culprit set explains:

- `good-end-fails`: every configuration fails, the good end included (a broken environment).
- `bad-end-passes`: every configuration passes, the bad end included (the failure does not
  reproduce, or it does not come from the candidates).
- `unexplained`: the ends differ (∅ passes, the full set fails) but the configurations in between
  behave like a coin flip: a culprit set larger than `max_order`, or a non-monotone interaction.

The space is dense ([H, n] membership, H = Σ_k C(n, k)), and every proposal weighs each culprit
set, so its size is bounded: MAX_CULPRIT_SETS, the sets of 64 candidates up to pairs. Beyond, the
space is refused before anything is allocated (3000 candidates asked for 101 GiB; 600 took
2.7 GB and minutes a proposal): narrow the candidates (docs/bisect.md, "Many differences").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dsv4bisect.errors import BisectError

GOOD_END_FAILS = "good-end-fails"
BAD_END_PASSES = "bad-end-passes"
UNEXPLAINED = "unexplained"
CATCH_ALLS = (GOOD_END_FAILS, BAD_END_PASSES, UNEXPLAINED)

# Risk tier (patchspec.spec.Patch.tier) -> prior weight of a patch; 1 = most likely culprit.
TIER_WEIGHT: Mapping[int, float] = {1: 2.0, 2: 1.0, 3: 0.5}

MAX_CANDIDATES = 64  # at the default max_order 2
MAX_CULPRIT_SETS = MAX_CANDIDATES + math.comb(MAX_CANDIDATES, 2)  # 2080


def culprit_sets(n: int, max_order: int) -> int:
    """How many culprit sets n candidates have up to max_order (the rows of the space)."""
    return sum(math.comb(n, k) for k in range(1, max_order + 1))


def check_size(n: int, max_order: int) -> None:
    """BisectError when the space would hold more than MAX_CULPRIT_SETS culprit sets."""
    sets = culprit_sets(n, max_order)
    if sets > MAX_CULPRIT_SETS:
        largest = 1
        while culprit_sets(largest + 1, max_order) <= MAX_CULPRIT_SETS:
            largest += 1
        raise BisectError(
            f"{n} candidates make {sets} culprit sets up to order {max_order}; one search "
            f"weighs at most {MAX_CULPRIT_SETS} (at most {largest} candidates at this order)",
            f"bisect at most {largest} candidates at a time (--candidates NAME,...); when the "
            "culprit is not among them the bisect ends BAD-END-PASSES, and the rest are next")


DEFAULT_ORDER_MASS: Mapping[int, tuple[float, ...]] = {
    1: (1.0,),
    2: (0.5, 0.5),
    3: (0.45, 0.35, 0.2),
}


@dataclass(frozen=True)
class Hypothesis:
    """One explanation: a culprit set (kind "set") or a catch-all (kind = its name)."""

    kind: str
    members: frozenset[str] = frozenset()

    @property
    def is_set(self) -> bool:
        return self.kind == "set"

    def describe(self) -> str:
        if not self.is_set:
            return self.kind
        return "{" + ", ".join(sorted(self.members)) + "}"


@dataclass(frozen=True)
class Priors:
    """Prior masses. `order_mass[k-1]` is the mass on culprit sets of size k (renormalised over
    the orders that exist); within an order a set's weight is the product of its members'
    weights (default 1 each; `tier_weights` maps risk tiers to weights)."""

    order_mass: tuple[float, ...] | None = None
    weights: Mapping[str, float] = field(default_factory=dict)
    good_end_fails: float = 0.02
    bad_end_passes: float = 0.02
    unexplained: float = 0.005


def tier_weights(tiers: Mapping[str, int]) -> dict[str, float]:
    """Prior weights from risk tiers (1 -> 2.0, 2 -> 1.0, 3 -> 0.5; unknown tiers -> 1.0)."""
    return {name: TIER_WEIGHT.get(tier, 1.0) for name, tier in tiers.items()}


class HypothesisSpace:
    """Culprit sets as rows of a membership matrix, catch-alls as the last three entries.

    `members`: [H, n] uint8 (row h marks the candidates in culprit set h); `sizes`: [H];
    `log_prior`: [H + 3], the three catch-alls last in `CATCH_ALLS` order.
    """

    def __init__(self, candidates: Sequence[str], max_order: int, priors: Priors) -> None:
        self.candidates = tuple(candidates)
        self.index = {name: i for i, name in enumerate(self.candidates)}
        self.max_order = max_order
        n = len(self.candidates)
        check_size(n, max_order)
        orders = [k for k in range(1, max_order + 1) if k <= n]
        combos = [c for k in orders for c in itertools.combinations(range(n), k)]
        self.members = np.zeros((len(combos), n), dtype=np.uint8)
        for row, combo in enumerate(combos):
            self.members[row, list(combo)] = 1
        self.members_f = self.members.astype(np.float64)  # [H, n]
        self.members_t = np.ascontiguousarray(self.members_f.T)  # [n, H]
        self.sizes = self.members.sum(axis=1).astype(np.int64)
        self.n_sets = len(combos)
        self.log_prior = _log_prior(self, max_order, orders, priors)

    @property
    def n_hypotheses(self) -> int:
        return self.n_sets + len(CATCH_ALLS)

    def hypothesis(self, i: int) -> Hypothesis:
        if i >= self.n_sets:
            return Hypothesis(CATCH_ALLS[i - self.n_sets])
        cols = np.flatnonzero(self.members[i])
        return Hypothesis("set", frozenset(self.candidates[c] for c in cols))

    def mask(self, subset: frozenset[str] | set[str]) -> np.ndarray:
        """[n] uint8 indicator of a subset; unknown names raise BisectError."""
        mask = np.zeros(len(self.candidates), dtype=np.uint8)
        for name in subset:
            if name not in self.index:
                raise BisectError(
                    f"`{name}` is not a candidate of this bisect",
                    f"candidates: {', '.join(self.candidates)}",
                )
            mask[self.index[name]] = 1
        return mask

    def subset(self, mask: np.ndarray) -> frozenset[str]:
        return frozenset(self.candidates[i] for i in np.flatnonzero(mask))

    def contained(self, mask: np.ndarray) -> np.ndarray:
        """[H] bool: which culprit sets lie inside the subset (so the subset truly fails)."""
        return (self.members_f @ (1.0 - mask)) == 0


def _log_prior(space: HypothesisSpace, max_order: int, orders: list[int], p: Priors) -> np.ndarray:
    mass = p.order_mass if p.order_mass is not None else DEFAULT_ORDER_MASS.get(max_order)
    if mass is None or len(mass) < max_order:
        raise BisectError(
            f"no prior mass for culprit sets of size up to {max_order}",
            "give one order_mass entry per order, e.g. (0.5, 0.35, 0.15)",
        )
    for value in (*mass, p.good_end_fails, p.bad_end_passes, p.unexplained):
        if not (value >= 0 and math.isfinite(value)):
            raise BisectError(f"prior mass {value} is not a non-negative number",
                               "give priors as finite numbers >= 0")
    for name, w in p.weights.items():
        if name in space.index and not (w > 0 and math.isfinite(w)):
            raise BisectError(f"prior weight of `{name}` is {w}", "weights must be positive")
    weights = np.array([float(p.weights.get(c, 1.0)) for c in space.candidates])
    log_w = space.members.astype(np.float64) @ np.log(weights)  # [H]: log Π member weights
    order_total = sum(mass[k - 1] for k in orders)
    catch = p.good_end_fails + p.bad_end_passes + p.unexplained
    if order_total <= 0 or catch >= 1:
        raise BisectError("the prior puts no mass on any culprit set", "check order_mass")
    prior = np.zeros(space.n_hypotheses)
    for k in orders:
        rows = space.sizes == k
        w = np.exp(log_w[rows] - log_w[rows].max())
        prior[: space.n_sets][rows] = (1 - catch) * mass[k - 1] / order_total * w / w.sum()
    prior[space.n_sets :] = (p.good_end_fails, p.bad_end_passes, p.unexplained)
    with np.errstate(divide="ignore"):
        return np.log(prior / prior.sum())
