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


VERDICTS = (None, "PASS", "FAIL", "WARN", "CANNOT_TEST", "BETWEEN")
OUTCOMES = ("pass", "fail", "skip", "between")  # probe/verdict.SEARCH_WORDS' values
DAMAGED_HINT = ("the ledger was edited or damaged: restore it from a copy, or give this bisect "
                "a fresh --ledger (its finished trials cannot be trusted)")


class DamagedRow(ValueError):
    """A ledger row whose contents are not what dsv4bisect wrote (the schema passed)."""


def _damaged(table: str, key: Any, column: str, what: str, value: Any) -> DamagedRow:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return DamagedRow(f"ledger table `{table}`, row {key}: `{column}` {what} (got {shown})")


def _json_cell(table: str, key: Any, column: str, text: Any, kind: type | tuple[type, ...],
               *, nullable: bool = False) -> Any:
    """A JSON column's value, of `kind`; DamagedRow naming the row otherwise."""
    if text is None and nullable:
        return None
    if not isinstance(text, str):
        raise _damaged(table, key, column, "is not JSON text", text)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise _damaged(table, key, column, "is not valid JSON", text) from None
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in _types(kind):
        raise _damaged(table, key, column, f"is not {_kind_name(kind)}", value)
    return value


def _types(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {dict: "a JSON object", list: "a JSON array"}
    return " or ".join(names.get(t, t.__name__) for t in _types(kind))


def _cell(table: str, key: Any, column: str, value: Any, kind: type | tuple[type, ...],
          *, nullable: bool = False) -> Any:
    """A plain column's value, of `kind` (SQLite stores any type in any column)."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise _damaged(table, key, column, f"is not {_kind_name(kind)}", value)
    return value


def _strings(table: str, key: Any, column: str, value: Any) -> Any:
    items = value.items() if isinstance(value, dict) else enumerate(value)
    if not all(isinstance(v, str) for _, v in items) or (
            isinstance(value, dict) and not all(isinstance(k, str) for k in value)):
        raise _damaged(table, key, column, "holds a value that is not a string", value)
    return value


def _details(key: Any, text: Any) -> dict[str, Any]:
    """A trial's details; `error_rates` (what the search weighs the verdict with) checked."""
    details = _json_cell("trials", key, "details", text or None, dict, nullable=True) or {}
    rates = details.get("error_rates")
    if rates is not None and not (
            isinstance(rates, list) and len(rates) == 2 and all(
                isinstance(r, int | float) and not isinstance(r, bool) and 0 <= r <= 1
                for r in rates)):
        raise _damaged("trials", key, "details.error_rates", "is not two rates in [0, 1]",
                       rates)
    return details


def trial_from_row(row: sqlite3.Row) -> TrialRow:
    """A trials row, every cell checked: a damaged row is a DamagedRow naming it."""
    key = row["id"]
    t = "trials"
    verdict = row["verdict"]
    if verdict not in VERDICTS:
        raise _damaged(t, key, "verdict", "is not a verdict", verdict)
    return TrialRow(
        id=_cell(t, key, "id", row["id"], int),
        run_id=_cell(t, key, "run_id", row["run_id"], str),
        step=_cell(t, key, "step", row["step"], int),
        key=TrialKey(_cell(t, key, "fingerprint", row["fingerprint"], str),
                     _cell(t, key, "probe", row["probe"], str),
                     _cell(t, key, "seed_block", row["seed_block"], int)),
        attempt=_cell(t, key, "attempt", row["attempt"], int),
        patches=_strings(t, key, "patches", _json_cell(t, key, "patches", row["patches"], dict)),
        subset=frozenset(_strings(t, key, "subset",
                                  _json_cell(t, key, "subset", row["subset"], list))),
        status=_cell(t, key, "status", row["status"], str),
        verdict=verdict,
        signature=_cell(t, key, "signature", row["signature"], str, nullable=True),
        details=_details(key, row["details"]),
        duration_s=_cell(t, key, "duration_s", row["duration_s"], (int, float), nullable=True),
        throughput=_cell(t, key, "throughput", row["throughput"], (int, float), nullable=True),
        log_path=_cell(t, key, "log_path", row["log_path"], str, nullable=True),
        trial_dir=_cell(t, key, "trial_dir", row["trial_dir"], str, nullable=True),
        started=_cell(t, key, "started", row["started"], (int, float)),
        finished=_cell(t, key, "finished", row["finished"], (int, float), nullable=True),
    )


def run_from_row(row: sqlite3.Row) -> RunRow:
    """A runs row, its settings and result checked to be JSON objects."""
    key, t = row["id"], "runs"
    return RunRow(
        _cell(t, key, "id", row["id"], str),
        _cell(t, key, "run_dir", row["run_dir"], str),
        _cell(t, key, "created", row["created"], (int, float)),
        _json_cell(t, key, "settings", row["settings"], dict),
        _cell(t, key, "status", row["status"], str),
        _json_cell(t, key, "result", row["result"] or None, dict, nullable=True),
    )


def step_from_row(row: sqlite3.Row) -> StepRow:
    key, t = f"{row['run_id']}/{row['step']}", "steps"
    outcome = row["outcome"]
    if outcome not in OUTCOMES:
        raise _damaged(t, key, "outcome", "is not pass, fail, skip or between", outcome)
    return StepRow(
        _cell(t, key, "step", row["step"], int),
        frozenset(_strings(t, key, "subset", _json_cell(t, key, "subset", row["subset"], list))),
        _cell(t, key, "seed_block", row["seed_block"], int),
        outcome,
        _cell(t, key, "signature", row["signature"], str, nullable=True),
        _cell(t, key, "trial_id", row["trial_id"], int, nullable=True),
    )
