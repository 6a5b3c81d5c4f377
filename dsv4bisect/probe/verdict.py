"""The probe's verdict: a frozen value with its evidence and a stable JSON form.

JSON (`Verdict.to_dict()`, schema `dsv4bisect.verdict/1`; docs/probe.md documents every field):

    verdict        PASS | FAIL | WARN | CANNOT_TEST | BETWEEN (a sequential trial probe at its
                   cap, inside a bisect only: docs/probe.md)
    exit_code      0 | 1 | 4 | 125 (git bisect run: good, bad, -, skip); BETWEEN 1
    reasons        human sentences, most important first
    probe          {tier, spec_hash, seed_block, probe_version, warmup_requests}
    families.<f>   {n, baseline_accuracy, candidate_accuracy, repeat_accuracy, baseline_right,
                    b, c, p_value, evidence}
    overall        {n, b, c, p_value, alpha, families}
    cells[]        {cell, arm, concurrency, n, b, c, p_value, p_holm, failed}
    signatures     {candidate: {name: [seeds]}, repeat: {...}, hard_fail: bool}
    drift          {status (pass|warn|absent), multiple, trigger, candidate: {kl_mean, kl_p99,
                    top1_agreement, ...}, floor: {...}, null: {arms, views, false_alarm},
                    gates: {...}}
    aa             {n, flips, b, c, p_value}
    power          {alpha, n_baseline_right, baseline_accuracy, min_detectable_loss_rate,
                    min_detectable_drop, zero_loss_bound, statement}
    evidence       {baseline, baseline_repeat, candidate, heatmap}: paths or null
    conditions.<f> {arms, concurrency, requests: {"arm@level": n}}: what each family ran under
    throughput     {baseline, candidate}: per level {requests, tokens, wall_s, requests_per_s,
                    tokens_per_s, arms, ttft_s_mean, ttft_n, itl_s_mean, itl_n (the streamed
                    answers' mean time to first token and inter-token latency: probe/stream.py;
                    absent in a run made before the probe streamed)}; decoding {baseline,
                    candidate}: `greedy`, or `greedy,
                    speculative NEXTN (...)` where the server speculated (judge.decoding)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dsv4bisect.errors import ExitCode

VERDICT_SCHEMA = "dsv4bisect.verdict/1"
PASS, FAIL, WARN, CANNOT_TEST = "PASS", "FAIL", "WARN", "CANNOT_TEST"
BETWEEN = "BETWEEN"
# The one vocabulary of a verdict: `dsv4bisect run`/`probe` write PASS/FAIL/WARN/CANNOT_TEST,
# the sequential trial probe PASS/FAIL/BETWEEN, a bisect's runners report these words and its
# search records them (a WARN counted as one end by --warn-as; CANNOT_TEST routed around).
# The ledger, the bisect's JSON and its report write what the search recorded in git bisect's
# words (the ledger's stored form since its first schema; docs/bisect.md).
SEARCH_WORDS = {PASS: "pass", FAIL: "fail", BETWEEN: "between", CANNOT_TEST: "skip"}
FROM_SEARCH_WORD = {word: verdict for verdict, word in SEARCH_WORDS.items()}
EXIT_CODES = {PASS: ExitCode.OK, FAIL: ExitCode.FAIL, WARN: ExitCode.WARN,
              CANNOT_TEST: ExitCode.CANNOT_TEST, BETWEEN: ExitCode.FAIL}

# -- the decision rule's constants (docs/probe.md "Verdict rule" says why each number) ----------
# A bisect runs ~10-20 trials; 1 % false FAIL per trial keeps a whole search mostly clean, and the
# search's noise model absorbs the rest. With c = 0 this needs b >= 7 lost answers (2^-7 < 0.01).
ALPHA_OVERALL = 0.01
ALPHA_CELL = 0.05  # family-wise over cells, Holm step-down
ALPHA_AA = 0.01  # two-sided: an A/A this lopsided means the baseline itself is not stable
HARD_SIGNATURE_SEEDS = 2  # distinct seeds with a hard signature where the baseline was right
# Drift never FAILs (facts lost do). It WARNs beyond the null model's gate (probe/null.py,
# docs/probe.md "The null model"); these constants are the fallback for a baseline without a
# null model: the A/A floor, checked on all scored positions and on each position bucket with at
# least DRIFT_MIN_BUCKET positions, so a fault that only shows at long context is not diluted.
DRIFT_WARN_KL = 1e-3  # nats/token: llama.cpp's q8_0-vs-f16 level; more is worth a flag
DRIFT_KL_AA_FACTOR_WARN = 4.0  # a noisy server: warn only when well above its own A/A
DRIFT_WARN_TOP1_DROP = 0.01  # fraction of positions whose argmax flips, beyond the A/A's
DRIFT_MIN_BUCKET = 256  # positions; the top-1 SE at 98 % agreement is then < 1 pp

@dataclass(frozen=True)
class FamilyResult:
    family: str
    n: int
    baseline_accuracy: float | None
    candidate_accuracy: float | None
    repeat_accuracy: float | None
    baseline_right: int
    b: int  # baseline right, candidate wrong
    c: int  # baseline wrong, candidate right
    p_value: float
    evidence: bool


@dataclass(frozen=True)
class CellResult:
    cell: str
    arm: str
    n: int
    b: int
    c: int
    p_value: float
    p_holm: float
    failed: bool
    concurrency: int = 1  # the level the cell's requests ran at


@dataclass(frozen=True)
class Verdict:
    """PASS/FAIL/WARN/CANNOT_TEST with everything that led to it."""

    verdict: str
    reasons: tuple[str, ...]
    probe: dict[str, Any]
    families: dict[str, FamilyResult] = field(default_factory=dict)
    overall: dict[str, Any] = field(default_factory=dict)
    cells: tuple[CellResult, ...] = ()
    signatures: dict[str, Any] = field(default_factory=dict)
    drift: dict[str, Any] = field(default_factory=dict)
    aa: dict[str, Any] = field(default_factory=dict)
    power: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, str | None] = field(default_factory=dict)
    # (false fail, false pass) a sequential trial probe's verdict holds to (also under
    # overall.sequential in the JSON); None: the fixed probe, whose rates the bisect measures.
    error_rates: tuple[float, float] | None = None
    # per family: arms, concurrency levels, requests per "arm@level" (paired requests only)
    conditions: dict[str, Any] = field(default_factory=dict)
    # {"baseline"|"candidate": {level: {requests, tokens, wall_s, requests_per_s, tokens_per_s}}}
    throughput: dict[str, Any] = field(default_factory=dict)
    # what decided a sequential trial probe's verdict (drift | signatures | accuracy | cap |
    # ends; also under overall.sequential in the JSON); None: the fixed probe
    decided_by: str | None = None

    @property
    def exit_code(self) -> int:
        return int(EXIT_CODES[self.verdict])

    def with_evidence(self, **paths: str | None) -> Verdict:
        return dataclasses.replace(self, evidence={**self.evidence, **paths})

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": VERDICT_SCHEMA, "verdict": self.verdict, "exit_code": self.exit_code,
            "reasons": list(self.reasons), "probe": self.probe,
            "families": {k: dataclasses.asdict(v) for k, v in self.families.items()},
            "overall": self.overall, "cells": [dataclasses.asdict(c) for c in self.cells],
            "signatures": self.signatures, "drift": self.drift, "aa": self.aa,
            "power": self.power, "evidence": self.evidence, "conditions": self.conditions,
            "throughput": self.throughput,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        if d.get("schema") != VERDICT_SCHEMA:
            raise ValueError(f"not a {VERDICT_SCHEMA} document")
        return cls(d["verdict"], tuple(d["reasons"]), d["probe"],
                   {k: FamilyResult(**v) for k, v in d.get("families", {}).items()},
                   d.get("overall", {}), tuple(CellResult(**c) for c in d.get("cells", [])),
                   d.get("signatures", {}), d.get("drift", {}), d.get("aa", {}),
                   d.get("power", {}), d.get("evidence", {}),
                   _rates(d.get("overall", {}).get("sequential")),
                   conditions=d.get("conditions", {}), throughput=d.get("throughput", {}),
                   decided_by=(d.get("overall", {}).get("sequential") or {}).get("decided_by"))


def exit_code_as(verdict: str, warn_exit: str = "pass") -> int:
    """The process exit code of a verdict when a drift WARN exits as `warn_exit` (`run
    --warn-as`; a bisect's rule for a WARN is its trial policy's): `pass` (0, the
    default: `git bisect run` then lands on the commit that loses facts, not on one that only
    drifts), `warn` (4, the verdict's own code) or `fail` (1)."""
    if verdict != WARN:
        return int(EXIT_CODES[verdict])
    return int({"pass": ExitCode.OK, "warn": ExitCode.WARN, "fail": ExitCode.FAIL}[warn_exit])


def _rates(sequential: dict[str, Any] | None) -> tuple[float, float] | None:
    if not sequential:
        return None
    return float(sequential["false_fail"]), float(sequential["false_pass"])
