"""The trial policy of a bisect: how its trials are judged and where they run, as one value.

Its words are enums defined here once: the profile's `bisect` block, the command line's choices
and the run file take them from here. `bisect/setup.py` resolves the policy once (the command
line over the profile), the run's request stores it (`bisect.json`: what `--resume` replays and
what a Ray node builds its runner from), and every part that acts on it takes the value whole:
the driver, the node runner, the sequential trial probe (docs/bisect.md, "The trial policy").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class WarnAs(str, Enum):
    """How a drift WARN (drift only, no fact lost) counts for the search."""

    AUTO = "auto"  # like the bad end where the bad end itself only drifts, else like the good end
    FAIL = "fail"
    PASS = "pass"


class DriftRule(str, Enum):
    """How a sequential trial judges its drift."""

    ABSOLUTE = "absolute"  # by the run's drift gate
    RELATIVE = "relative"  # against the two ends: nearer the good end's drift is not a fail


class Executor(str, Enum):
    """Where trials run (docs/cluster.md)."""

    LOCAL = "local"
    RAY = "ray"


@dataclass(frozen=True)
class TrialPolicy:
    """How a bisect's trials are judged and where they run.

    `hot`: trials switch patches in engines kept up (else each is a fresh launch);
    `sequential`: a hot trial other than the ends gets the sequential trial probe;
    `shard`: the Ray executor lends a round's idle node slots to the ends' probes;
    `full_ends`: the ends are probed at the full tier at once (else, where trials are hot and
    sequential, in two looks: bisect/end_looks.py, docs/bisect.md "Ends that stop when their
    question is answered");
    `warn_as`, `drift`, `executor`: the enums above. The default is a fresh-launch local
    bisect that counts a WARN by `auto` and judges drift by the run's gate."""

    warn_as: WarnAs = WarnAs.AUTO
    drift: DriftRule = DriftRule.ABSOLUTE
    hot: bool = False
    sequential: bool = False
    shard: bool = False
    executor: Executor = Executor.LOCAL
    full_ends: bool = False

    def __post_init__(self) -> None:
        for name, kind in (("warn_as", WarnAs), ("drift", DriftRule), ("executor", Executor)):
            object.__setattr__(self, name, kind(getattr(self, name)))  # a word from JSON: typed

    def warn_fails(self, bad_end_only_drifts: bool) -> bool:
        """Whether a drift WARN counts like the bad end (a FAIL for the search): the one
        implementation of `auto`, which says yes exactly where the bad end itself only drifts
        (a bisect on drift); where it loses facts, or is not measured yet, facts decide and a
        WARN is like the good end. `fail` and `pass` fix the answer either way."""
        if self.warn_as is WarnAs.AUTO:
            return bad_end_only_drifts
        return self.warn_as is WarnAs.FAIL

    @property
    def end_looks(self) -> bool:
        """Whether the ends are probed in two looks: hot sequential trials, `full_ends` off."""
        return self.hot and self.sequential and not self.full_ends

    @property
    def drift_relative(self) -> bool:
        return self.drift is DriftRule.RELATIVE

    def judging_rules(self) -> dict[str, Any]:
        """What a hot trial's verdict depends on beyond its probe (part of the hot runner's
        probe hash, so a ledger never mixes verdicts judged by different rules)."""
        return {"sequential": self.sequential, "warn_fails": self.warn_fails(True),
                "drift_relative": self.drift_relative}

    def describe(self) -> str:
        """One line for a report: `WARN counts as auto, drift relative, hot, sequential
        trials, sharded ends, executor ray`."""
        parts = [f"WARN counts as {self.warn_as.value}", f"drift {self.drift.value}",
                 "hot" if self.hot else "fresh launches"]
        parts += ["sequential trials"] * self.sequential + ["sharded ends"] * self.shard
        if self.sequential:
            parts.append("ends in two looks" if self.end_looks else "full ends")
        return ", ".join([*parts, f"executor {self.executor.value}"])

    def to_json(self) -> dict[str, Any]:
        return {"warn_as": self.warn_as.value, "drift": self.drift.value, "hot": self.hot,
                "sequential": self.sequential, "shard": self.shard,
                "executor": self.executor.value, "full_ends": self.full_ends}

    @classmethod
    def from_json(cls, request: Mapping[str, Any]) -> TrialPolicy:
        """The policy of a run's request: its `policy` object, or the flat keys a request held
        before there was one (then `sequential` is `hot`: every hot runner probed so). A
        request from before the ends' looks ran full ends: it resumes so (`full_ends`)."""
        doc = request.get("policy")
        if isinstance(doc, Mapping):
            return cls(WarnAs(doc["warn_as"]), DriftRule(doc["drift"]), bool(doc["hot"]),
                       bool(doc["sequential"]), bool(doc["shard"]), Executor(doc["executor"]),
                       bool(doc.get("full_ends", True)))
        hot = bool(request.get("hot", False))
        executor = Executor(request.get("executor") or Executor.LOCAL)
        return cls(WarnAs(request.get("warn_as") or WarnAs.AUTO),
                   DriftRule(request.get("drift") or DriftRule.ABSOLUTE), hot, hot,
                   hot and executor is Executor.RAY and bool(request.get("shard", True)),
                   executor, full_ends=True)


DEFAULT_POLICY = TrialPolicy()  # a fresh-launch local bisect, `--warn-as auto`, absolute drift
