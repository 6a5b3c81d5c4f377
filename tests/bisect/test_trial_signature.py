"""The short reason a bisect shows and keeps for a trial that did not pass: what decided it."""

from __future__ import annotations

from dsv4bisect.bisect.trials.engine_runner import signature_of
from dsv4bisect.probe import verdict as V


def _verdict(verdict: str, drift: str = "pass", decided: str | None = None,
             signatures: dict | None = None) -> V.Verdict:
    return V.Verdict(verdict, ("r",), {}, drift={"status": drift},
                     signatures=signatures or {}, decided_by=decided)


def test_a_sequential_trial_is_labelled_by_what_decided_it() -> None:
    # the trials of the batch-kv-slot bisect: drift WARNs, but the answers decided
    assert signature_of(_verdict(V.FAIL, "warn", "accuracy")) == "accuracy"
    assert signature_of(_verdict(V.FAIL, "warn", "drift")) == "drift"
    assert signature_of(_verdict(V.BETWEEN, "warn", "drift")) == "between"


def test_a_full_probe_fail_is_facts_lost_and_a_warn_is_drift() -> None:
    assert signature_of(_verdict(V.FAIL, "warn")) == "accuracy"
    assert signature_of(_verdict(V.WARN, "warn")) == "drift"
    assert signature_of(_verdict(V.PASS, "warn")) is None
    hard = {"hard_fail": True, "candidate": {"garbage": [1, 2]}}
    assert signature_of(_verdict(V.FAIL, "warn", signatures=hard)) == "garbage"
    assert signature_of(_verdict(V.FAIL, signatures={"crash": True})) == "crash"
