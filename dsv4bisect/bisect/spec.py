"""What a bisect is asked: the candidates, the two ends, and the search settings.

How a trial's verdict counts for the search (a drift WARN) is the trial policy's, kept in the
run's request (dsv4bisect/policy.py); the copy of that rule in settings an older ledger wrote is
not read.

A configuration is named by the subset S of candidates switched to their bad-end state; every
other patch keeps its good-end state (so an inert patch left out of the candidates runs as at
the good end).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dsv4bisect.bisect.search.design import DEFAULT_NOISE, Noise
from dsv4bisect.bisect.search.hypotheses import Priors
from dsv4bisect.bisect.search.pricing import StepCosts
from dsv4bisect.bisect.search.search import Search
from dsv4bisect.bisect.search.settings import validate_settings
from dsv4bisect.errors import BisectError

SPEC_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: no costs, no trial noise (the unpriced design)


@dataclass(frozen=True)
class BisectSpec:
    candidates: tuple[str, ...]
    good: Mapping[str, str]  # patch -> variant at the good end
    bad: Mapping[str, str]  # patch -> variant at the bad end
    noise: Noise = DEFAULT_NOISE
    confidence: float = 0.95
    max_trials: int | None = None
    parallel: int = 1
    max_order: int = 2
    weights: Mapping[str, float] = field(default_factory=dict)  # prior weight per candidate
    order_mass: tuple[float, ...] | None = None  # prior mass on singles, pairs (, triples)
    design_discount: float = 0.03  # see docs/bisect.md, "Singles first"; 1.0 turns it off
    # The rates the sequential trial probe holds non-end trials to (None: `noise`), and what
    # each step costs (pricing.py; None: the unpriced design). Both steer the design only.
    trial_noise: Noise | None = None
    costs: StepCosts | None = None
    confirm: bool = True  # the fresh confirmation after FOUND in hot mode (--no-confirm: off)
    # of the `parallel` nodes, those an end's trial takes where the executor shards the ends
    # (bisect/rounds.py `end_nodes`; steers the design's prices only)
    end_nodes: int = 1
    # the executor runs the first round's other proposals beside the ends (rounds.py BESIDE)
    beside_ends: bool = False

    def __post_init__(self) -> None:
        # the search's own check, here too: a bad setting is reported before anything runs
        validate_settings(self.candidates, self.noise, self.confidence, self.max_trials,
                          self.parallel, self.max_order, self.design_discount, self.end_nodes)
        for name in self.candidates:
            if self.good.get(name) == self.bad.get(name):
                raise BisectError(
                    f"candidate `{name}` is the same at the good and bad ends",
                    "candidates are the patches that differ between the ends",
                )

    def patches_for(self, subset: frozenset[str]) -> dict[str, str]:
        """The patch set of a configuration: `subset` at its bad-end state, the rest good."""
        unknown = subset - set(self.candidates)
        if unknown:
            raise BisectError(f"`{min(unknown)}` is not a candidate of this bisect",
                              "name only the bisect's candidates (see its plan)")
        out = {name: v for name, v in self.good.items() if name not in subset}
        out.update({name: self.bad[name] for name in subset if name in self.bad})
        return out

    def search(self) -> Search:
        """A fresh search with these settings (replaying the ledger's records into it resumes)."""
        return Search(
            self.candidates,
            noise=self.noise,
            confidence=self.confidence,
            max_trials=self.max_trials,
            parallel=self.parallel,
            max_order=self.max_order,
            priors=Priors(order_mass=self.order_mass, weights=dict(self.weights)),
            design_discount=self.design_discount,
            trial_noise=self.trial_noise,
            costs=self.costs,
            confirm=self.confirm,
            end_nodes=self.end_nodes,
            beside_ends=self.beside_ends,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SPEC_VERSION,
            "candidates": list(self.candidates),
            "good": dict(self.good),
            "bad": dict(self.bad),
            "noise": _noise_json(self.noise),
            "confidence": self.confidence,
            "max_trials": self.max_trials,
            "parallel": self.parallel,
            "max_order": self.max_order,
            "weights": dict(self.weights),
            "order_mass": list(self.order_mass) if self.order_mass else None,
            "design_discount": self.design_discount,
            "trial_noise": _noise_json(self.trial_noise),
            "costs": self.costs.to_json() if self.costs is not None else None,
            "confirm": self.confirm,
            "end_nodes": self.end_nodes,
            "beside_ends": self.beside_ends,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BisectSpec:
        if data.get("version") not in READABLE_VERSIONS:
            raise BisectError(
                f"bisect settings version {data.get('version')} is not supported",
                "start a new bisect with this version of dsv4bisect",
            )
        try:
            return cls._from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BisectError(
                f"the bisect's settings in the ledger are damaged ({type(exc).__name__}: "
                f"{str(exc)[:80]})",
                "the ledger was edited or damaged: restore it from a copy, or start a fresh "
                "bisect with its own --ledger") from None

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> BisectSpec:
        return cls(
            candidates=tuple(data["candidates"]),
            good=dict(data["good"]),
            bad=dict(data["bad"]),
            noise=Noise(data["noise"]["false_fail"], data["noise"]["false_pass"]),
            confidence=data["confidence"],
            max_trials=data["max_trials"],
            parallel=data["parallel"],
            max_order=data["max_order"],
            weights=dict(data["weights"]),
            order_mass=tuple(data["order_mass"]) if data["order_mass"] else None,
            design_discount=data["design_discount"],
            trial_noise=_noise_of(data.get("trial_noise")),
            costs=StepCosts.from_json(data["costs"]) if data.get("costs") else None,
            confirm=data.get("confirm", True),
            end_nodes=data.get("end_nodes", 1),  # a ledger of before it: one node
            beside_ends=data.get("beside_ends", False),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


def _noise_json(noise: Noise | None) -> dict[str, float] | None:
    return None if noise is None else {"false_fail": noise.false_fail,
                                       "false_pass": noise.false_pass}


def _noise_of(data: Mapping[str, float] | None) -> Noise | None:
    return None if data is None else Noise(data["false_fail"], data["false_pass"])
