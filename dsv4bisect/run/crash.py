"""Verdicts that do not come from the judge: an engine crash, or a configuration that cannot be
tested. Both are `Verdict` values with the reason and the engine's log tail (DESIGN §6).

A crash (the engine process exited, at start or mid-probe) is retried once. If the candidate
crashes again it FAILs with the signature `crash` — a patch that crashes the engine is a culprit.
If the good end crashes twice, nothing can be judged: CANNOT_TEST. Infrastructure (a busy port, a
health timeout without a crash, a server that answers garbage while alive) is CANNOT_TEST at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.spec import ProbeSpec

CRASH = "crash"
TAIL_LINES = 20


@dataclass(frozen=True)
class Crash:
    """One engine exit that was not asked for."""

    arm: str  # baseline | candidate
    attempt: int  # 1-based launch attempt of that arm
    phase: str  # start (before ready) | probe (after ready)
    role: str
    returncode: int | None
    log_tail: str
    log_path: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self) -> str:
        when = "while starting" if self.phase == "start" else "while being probed"
        return (f"attempt {self.attempt}: `{self.role}` exited with code {self.returncode} "
                f"{when}")


def probe_head(spec: ProbeSpec) -> dict[str, Any]:
    """The `probe` block of a verdict (what the judge writes too)."""
    return {"tier": spec.tier, "spec_hash": spec.spec_hash(), "seed_block": spec.seed_block,
            "probe_version": spec.to_dict()["probe_version"]}


def crash_verdict(spec: ProbeSpec, crashes: list[Crash], good_note: str) -> V.Verdict:
    """FAIL `crash`: the candidate crashed on every attempt; the good end did not."""
    last = crashes[-1]
    reasons = (
        (f"crash: the engine crashed on all {len(crashes)} attempts with this configuration "
         f"({'; '.join(c.sentence() for c in crashes)}); {good_note}"),
        f"log tail of `{last.role}` ({last.log_path}):\n{last.log_tail}",
    )
    signatures = {"candidate": {}, "repeat": {}, "hard_fail": True,
                  "crash": {"arm": last.arm, "attempts": [c.to_dict() for c in crashes]}}
    return V.Verdict(V.FAIL, reasons, probe_head(spec), signatures=signatures,
                     evidence={"log": last.log_path})


def good_end_crash_verdict(spec: ProbeSpec, crashes: list[Crash]) -> V.Verdict:
    last = crashes[-1]
    reasons = (
        (f"the good end crashed on all {len(crashes)} attempts "
         f"({'; '.join(c.sentence() for c in crashes)}): the baseline itself is broken, so "
         "the candidate cannot be judged"),
        f"log tail of `{last.role}` ({last.log_path}):\n{last.log_tail}",
    )
    return V.Verdict(V.CANNOT_TEST, reasons, probe_head(spec),
                     signatures={"crash": {"arm": last.arm,
                                           "attempts": [c.to_dict() for c in crashes]}},
                     evidence={"log": last.log_path})


def cannot_test_verdict(spec: ProbeSpec, arm: str, message: str, log_tail: str = "",
                        log_path: str | None = None, hint: str | None = None) -> V.Verdict:
    """Infrastructure: the configuration could not be tested (exit 125), with the log tail."""
    reasons = [f"cannot test the {arm}: {message.splitlines()[0] if message else 'unknown'}"]
    rest = "\n".join(message.splitlines()[1:]).strip()
    tail = log_tail.strip() or rest
    if tail:
        where = f" ({log_path})" if log_path else ""
        reasons.append(f"log tail{where}:\n{tail}")
    if hint:
        reasons.append(f"hint: {hint}")
    return V.Verdict(V.CANNOT_TEST, tuple(reasons), probe_head(spec),
                     evidence={"log": log_path} if log_path else {})
