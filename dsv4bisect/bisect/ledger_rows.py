"""The trial ledger's schema, its rows as frozen values, and the noise rates measured from
its evidence."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from dsv4bisect.bisect.search.design import DEFAULT_NOISE, Noise

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, run_dir TEXT NOT NULL, created REAL NOT NULL,
    settings TEXT NOT NULL, status TEXT NOT NULL, result TEXT);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(id),
    step INTEGER NOT NULL, fingerprint TEXT NOT NULL, probe TEXT NOT NULL,
    seed_block INTEGER NOT NULL, attempt INTEGER NOT NULL, patches TEXT NOT NULL,
    subset TEXT NOT NULL, status TEXT NOT NULL, verdict TEXT, signature TEXT, details TEXT,
    duration_s REAL, throughput REAL, log_path TEXT, trial_dir TEXT,
    started REAL NOT NULL, finished REAL);
CREATE UNIQUE INDEX IF NOT EXISTS trials_definitive ON trials (fingerprint, probe, seed_block)
    WHERE status = 'done' AND verdict IN ('PASS', 'FAIL', 'WARN', 'BETWEEN');
CREATE INDEX IF NOT EXISTS trials_key ON trials (fingerprint, probe, seed_block);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, subset TEXT NOT NULL,
    seed_block INTEGER NOT NULL, outcome TEXT NOT NULL, signature TEXT, trial_id INTEGER,
    PRIMARY KEY (run_id, step));
CREATE TABLE IF NOT EXISTS noise_evidence (
    id INTEGER PRIMARY KEY AUTOINCREMENT, probe TEXT NOT NULL, source TEXT NOT NULL,
    truth TEXT NOT NULL, outcome TEXT NOT NULL, fingerprint TEXT, run_id TEXT,
    trial_id INTEGER, created REAL NOT NULL);
"""


@dataclass(frozen=True)
class TrialKey:
    fingerprint: str
    probe: str
    seed_block: int


@dataclass(frozen=True)
class TrialRow:
    id: int
    run_id: str
    step: int
    key: TrialKey
    attempt: int
    patches: dict[str, str]
    subset: frozenset[str]
    status: str  # running | done | aborted | abandoned
    verdict: str | None  # PASS | FAIL | WARN | CANNOT_TEST
    signature: str | None
    details: dict[str, Any]
    duration_s: float | None
    throughput: float | None
    log_path: str | None
    trial_dir: str | None
    started: float
    finished: float | None


@dataclass(frozen=True)
class RunRow:
    id: str
    run_dir: str
    created: float
    settings: dict[str, Any]
    status: str
    result: dict[str, Any] | None


@dataclass(frozen=True)
class StepRow:
    step: int
    subset: frozenset[str]
    seed_block: int
    outcome: str  # pass | fail | skip
    signature: str | None
    trial_id: int | None


@dataclass(frozen=True)
class NoiseEstimate:
    """Probe error rates measured from the evidence: Jeffreys posterior means."""

    good_runs: int  # runs of configurations known to pass
    false_fails: int
    bad_runs: int  # runs of configurations known to fail
    false_passes: int

    @property
    def false_fail(self) -> float:
        return (self.false_fails + 0.5) / (self.good_runs + 1)

    @property
    def false_pass(self) -> float:
        return (self.false_passes + 0.5) / (self.bad_runs + 1)

    def noise(self, fallback: Noise = DEFAULT_NOISE, min_runs: int = 5) -> Noise:
        """The measured rates where there are at least `min_runs` runs, else the fallback."""
        return Noise(
            self.false_fail if self.good_runs >= min_runs else fallback.false_fail,
            self.false_pass if self.bad_runs >= min_runs else fallback.false_pass,
        )


def trial_from_row(row: sqlite3.Row) -> TrialRow:
    return TrialRow(
        id=row["id"],
        run_id=row["run_id"],
        step=row["step"],
        key=TrialKey(row["fingerprint"], row["probe"], row["seed_block"]),
        attempt=row["attempt"],
        patches=json.loads(row["patches"]),
        subset=frozenset(json.loads(row["subset"])),
        status=row["status"],
        verdict=row["verdict"],
        signature=row["signature"],
        details=json.loads(row["details"]) if row["details"] else {},
        duration_s=row["duration_s"],
        throughput=row["throughput"],
        log_path=row["log_path"],
        trial_dir=row["trial_dir"],
        started=row["started"],
        finished=row["finished"],
    )
