"""The SQLite ledger: WAL, keys, attempts, resume bookkeeping, noise evidence."""

from __future__ import annotations

import sqlite3

import pytest

from dsv4bisect.bisect.ledger import Ledger, StepRow, TrialKey
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.errors import BisectError


@pytest.fixture
def ledger(tmp_path):
    with Ledger.open(tmp_path / "ledger.sqlite") as led:
        yield led


def test_wal_mode_is_on(ledger, tmp_path):
    assert ledger.journal_mode == "wal"
    other = sqlite3.connect(tmp_path / "ledger.sqlite")
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_finished_trial_is_found_by_its_key_from_any_run(ledger, tmp_path):
    first = ledger.create_run(tmp_path / "a", {"x": 1})
    second = ledger.create_run(tmp_path / "b", {"x": 1})
    key = TrialKey("fp1", "probe1", 0)
    assert ledger.definitive(key) is None
    tid = ledger.start_trial(first, 0, key, 1, {"mma-decode": "split-k"}, frozenset({"p"}), "d")
    assert ledger.definitive(key) is None  # running is not finished
    ledger.finish_trial(tid, "FAIL", None, {"acc": 0.4}, 12.5, 1000.0, "log.txt")
    found = ledger.definitive(key)
    assert found is not None and found.run_id == first and found.verdict == "FAIL"
    assert found.details == {"acc": 0.4} and found.patches == {"mma-decode": "split-k"}
    assert ledger.definitive(TrialKey("fp1", "probe1", 1)) is None  # another seed block
    assert ledger.definitive(TrialKey("fp1", "probe2", 0)) is None  # another probe
    assert ledger.attempts(second, key) == []


def test_the_same_key_cannot_finish_twice(ledger, tmp_path):
    run = ledger.create_run(tmp_path / "a", {})
    key = TrialKey("fp", "probe", 0)
    for _ in range(2):
        tid = ledger.start_trial(run, 0, key, 1, {}, frozenset(), "d")
        if ledger.definitive(key) is None:
            ledger.finish_trial(tid, "PASS", None, {}, 1.0, None, None)
        else:
            with pytest.raises(sqlite3.IntegrityError):
                ledger.finish_trial(tid, "PASS", None, {}, 1.0, None, None)


def test_cannot_test_attempts_belong_to_their_run(ledger, tmp_path):
    run_a = ledger.create_run(tmp_path / "a", {})
    run_b = ledger.create_run(tmp_path / "b", {})
    key = TrialKey("fp", "probe", 0)
    tid = ledger.start_trial(run_a, 0, key, 1, {}, frozenset(), "d")
    ledger.finish_trial(tid, "CANNOT_TEST", "crash", {}, 3.0, None, None)
    assert [a.signature for a in ledger.attempts(run_a, key)] == ["crash"]
    assert ledger.attempts(run_b, key) == []
    assert ledger.definitive(key) is None


def test_running_trials_are_abandoned_on_resume(ledger, tmp_path):
    run = ledger.create_run(tmp_path / "a", {})
    tid = ledger.start_trial(run, 0, TrialKey("fp", "probe", 0), 1, {}, frozenset(), "d")
    assert ledger.abandon_running(run) == 1
    assert ledger.trial(tid).status == "abandoned"
    assert ledger.abandon_running(run) == 0


def test_steps_and_runs_round_trip(ledger, tmp_path):
    run = ledger.create_run(tmp_path / "a", {"candidates": ["a", "b"]})
    ledger.put_step(run, StepRow(0, frozenset(), 0, "pass", None, None))
    ledger.put_step(run, StepRow(1, frozenset({"a", "b"}), 0, "fail", "crash", 7))
    ledger.put_step(run, StepRow(1, frozenset({"a", "b"}), 0, "fail", "crash", 7))  # idempotent
    ledger.put_step(run, StepRow(2, frozenset({"a"}), 1, "between", "between", 8))
    assert [s.outcome for s in ledger.steps(run)] == ["pass", "fail", "between"]
    ledger.finish_run(run, "found", {"culprits": ["a"]})
    row = ledger.get_run(run)
    assert row.status == "found" and row.result == {"culprits": ["a"]}
    assert row.settings == {"candidates": ["a", "b"]}
    with pytest.raises(BisectError, match="no bisect run"):
        ledger.get_run("nope")


def test_noise_evidence_accumulates_into_measured_rates(ledger):
    for outcome in ["pass"] * 18 + ["fail"] * 2:
        ledger.add_noise_evidence("probe", "aa", "pass", outcome)
    for outcome in ["fail"] * 9 + ["pass"]:
        ledger.add_noise_evidence("probe", "end", "fail", outcome)
    ledger.add_noise_evidence("other", "aa", "pass", "fail")
    est = ledger.measured_noise("probe")
    assert (est.good_runs, est.false_fails, est.bad_runs, est.false_passes) == (20, 2, 10, 1)
    assert est.false_fail == pytest.approx(2.5 / 21)
    assert est.false_pass == pytest.approx(1.5 / 11)
    assert ledger.measured_noise("probe", sources=["aa"]).bad_runs == 0
    assert est.noise() == Noise(est.false_fail, est.false_pass)
    assert ledger.measured_noise("unseen").noise(Noise(0.07, 0.03)) == Noise(0.07, 0.03)
    with pytest.raises(BisectError):
        ledger.add_noise_evidence("probe", "aa", "maybe", "pass")


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "l.sqlite"
    Ledger.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    with pytest.raises(BisectError, match="schema 99"):
        Ledger.open(path)


def test_a_file_that_is_not_a_database_is_an_error(tmp_path):
    path = tmp_path / "l.sqlite"
    path.write_text("not sqlite" * 100)
    with pytest.raises(BisectError, match="cannot open the ledger"):
        Ledger.open(path)
