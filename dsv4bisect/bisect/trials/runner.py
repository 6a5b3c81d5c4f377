"""The contract between the bisect driver and whatever evaluates a configuration.

A `Runner` launches (or otherwise evaluates) one patch set and returns a `TrialResult`. It never
decides what a crash or an infrastructure error means for the search: it reports them (verdict
CANNOT_TEST, signature "crash" for an engine crash) and the driver decides (retry once; a
repeated crash away from the good end is a FAIL with signature "crash"). Verdicts are
probe/verdict.py's words: PASS, FAIL, WARN (drift only; the trial policy says how the search
counts it), CANNOT_TEST (infrastructure or a crash) and BETWEEN (a sequential trial probe
that reached its cap undecided: evidence for neither end, never a pass; docs/bisect.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

CRASH = "crash"


@dataclass(frozen=True)
class TrialResult:
    """One trial's outcome, built by keyword past its verdict; `details` is its JSON evidence
    (the ledger's and the report's), everything the bisect itself acts on is typed."""

    verdict: str  # PASS | FAIL | WARN | CANNOT_TEST | BETWEEN (probe/verdict.py)
    _: KW_ONLY
    signature: str | None = None  # e.g. "crash", "garbage", "timeout"
    duration_s: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)  # scores / evidence (JSON-able)
    throughput: float | None = None  # tokens/s measured during the trial, if any
    log_path: str | None = None
    # Verdicts of A/A comparisons (the good configuration against itself) the runner made
    # inside this trial; each is noise evidence (a FAIL there is a false fail).
    aa_verdicts: tuple[str, ...] = ()
    # The error rates this verdict holds to (false_fail, false_pass), where the trial's probe
    # states them (the sequential trial probe does); None: the search's own noise applies.
    error_rates: tuple[float, float] | None = None
    requests: int | None = None  # probe requests this trial sent, where counted

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TrialResult:
        rates = doc.get("error_rates")  # what the search weighs a sequential verdict with
        return cls(**{**doc, "details": dict(doc.get("details") or {}),
                      "aa_verdicts": tuple(doc.get("aa_verdicts") or ()),
                      "error_rates": None if rates is None else tuple(map(float, rates))})


@dataclass(frozen=True)
class FreshLaunch:
    """How a hot runner confirms its culprits: a fresh launch of the configuration (its own
    fingerprint: the deployment's graph mode, no switch before the probe) and its trial."""

    fingerprint: Callable[[Mapping[str, str]], str]
    run: Callable[[dict[str, str], int, Path], TrialResult]


@runtime_checkable
class Runner(Protocol):
    """Evaluates configurations. `probe_hash` identifies what is measured (the probe spec and
    its version); `fingerprint` identifies the configuration (for the engine runner: the
    resolved engine configuration's fingerprint). Both are part of the ledger key.

    The optional capabilities are members too, so the driver and the CLI ask, never probe;
    `TrialRunner` gives the defaults of a runner that has none of them."""

    @property
    def probe_hash(self) -> str: ...

    @property
    def hot(self) -> bool:
        """Whether trials switch patches in engines kept up (a FOUND result is then confirmed
        in a fresh launch where `fresh()` can, or the report says it was not)."""

    @property
    def ends_schedule(self) -> str | None:
        """How the driver runs the ends, their probes sharded across the slots, every other
        trial on a slot of its own: `rounds.ALONE` or `rounds.TOGETHER`; None: each proposal
        as it comes, on a slot of its own (bisect/rounds.py)."""

    def fingerprint(self, patches: Mapping[str, str]) -> str: ...

    def run(self, patches: dict[str, str], seed_block: int, trial_dir: Path) -> TrialResult: ...

    def fresh(self) -> FreshLaunch | None:
        """The fresh-launch confirmation of a hot runner; None where it cannot launch fresh."""

    def begin_round(self, trials: int, good_block: int | None = None) -> None:
        """The driver starts a round of `trials` trials (a node runner lends the idle slots to
        the round's probes as shards); `good_block`: the seed block of the good end's trial
        among them, if any (a bad end of that block beside it starts its probe before the
        good end's run exists, and is judged against it: probe/ahead.py)."""

    def stop_all(self) -> None:
        """Ctrl-C: stop the engines of every trial in flight (worker threads, nodes)."""

    def close(self) -> None:
        """The bisect is over: stop what the runner keeps up (hot engines, Ray actors)."""


class TrialRunner:
    """The optional capabilities of `Runner` for a runner that has none: not hot, no fresh
    confirmation, nothing in flight to stop or kept up to close. Runners subclass it and
    override what they do have."""

    hot = False
    ends_schedule: str | None = None

    def fresh(self) -> FreshLaunch | None:
        return None

    def begin_round(self, trials: int, good_block: int | None = None) -> None:
        return None

    def stop_all(self) -> None:
        return None

    def close(self) -> None:
        return None
