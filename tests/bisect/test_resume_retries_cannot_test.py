"""A resume never replays a conclusion reached only through CANNOT_TEST (issue 40, item 1).

A `--test-cmd` bisect (tests/bisect/fake_check.py, a real process per trial) whose trials with
the culprit on cannot test (exit 125, as when the engine they need was killed) ends without the
culprit; its resume, with the check able to test again, re-tries those trials instead of
replaying their SKIPs, and names the culprit. Crashes of a candidate stay replayed: a crash is
the configuration's own outcome; a good end that only crashed is re-tried (it is no answer)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dsv4bisect.bisect.driver import resume_bisect, start_bisect
from dsv4bisect.bisect.ledger import Ledger
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.search import Status
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.testcmd import TestCommandRunner
from dsv4bisect.bisect.trials.runner import CRASH, TrialResult
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.probe import verdict as V
from tests.bisect.test_bisect_driver import OracleRunner, _supersets, spec

CHECK = Path(__file__).with_name("fake_check.py")
CANDIDATES = ("mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer")
CULPRIT = "mma-decode"


def test_a_resume_retries_the_trials_that_could_not_test(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "invocations.log"
    runner = TestCommandRunner([sys.executable, str(CHECK), str(log), CULPRIT])
    patches = builtin_patches()
    spec = BisectSpec(candidates=CANDIDATES, good={},
                      bad={n: patches[n].default_variant for n in CANDIDATES}, noise=Noise())
    monkeypatch.setenv("FAKE_CHECK_CANNOT", f"{CULPRIT}:{len(CANDIDATES)}")
    with Ledger.open(tmp_path / "ledger.sqlite") as ledger:
        first = start_bisect(spec, runner, ledger, tmp_path / "run")
    assert first.result.status is not Status.FOUND  # the answer was lost with the trials
    skipped = [s for s in first.steps if s.outcome == "skip"]
    assert skipped and all(CULPRIT in s.subset for s in skipped)
    cannot = log.read_text().count(" cannot\n")

    monkeypatch.delenv("FAKE_CHECK_CANNOT")  # the engine can be launched again
    again = resume_bisect(tmp_path / "run", runner)
    assert again.result.status is Status.FOUND and again.result.culprits == {CULPRIT}
    assert again.trials_run >= 1  # re-tried, not replayed
    assert not [s for s in again.steps if s.outcome == "skip"]  # no step of the old path left
    assert log.read_text().count(" cannot\n") == cannot  # none cannot test now

    replay = resume_bisect(tmp_path / "run", runner)  # a finished resume replays what it found
    assert replay.trials_run == 0 and replay.result.culprits == {CULPRIT}



def test_a_resume_replays_a_candidates_crashes_and_retries_the_good_ends(tmp_path: Path) -> None:
    crash = TrialResult(V.CANNOT_TEST, signature=CRASH, duration_s=1.0)
    with Ledger.open(tmp_path / "ledger.sqlite") as ledger:
        first = OracleRunner({"none of them"})
        first.verdicts = {s: [crash, crash] for s in _supersets({"g"})}
        found = start_bisect(spec(), first, ledger, tmp_path / "crash")
        assert found.result.culprits == {"g"}
        again = OracleRunner({"none of them"})  # it would not crash now: never asked
        replay = resume_bisect(tmp_path / "crash", again, ledger=ledger)
        assert replay.result.culprits == {"g"} and again.calls == []
    with Ledger.open(tmp_path / "other.sqlite") as ledger:  # no trial of the first to reuse
        dead = OracleRunner({"a"})
        dead.verdicts = {frozenset(): [crash, crash]}
        assert start_bisect(spec(), dead, ledger, tmp_path / "good").result.status \
            is Status.UNTESTABLE
        retried = resume_bisect(tmp_path / "good", OracleRunner({"a"}), ledger=ledger)
        assert retried.result.culprits == {"a"}
