"""The driver: ledger lookups, verdict mapping, retries, crashes, resume, parallel rounds."""

from __future__ import annotations

import hashlib
import json
import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from dsv4bisect.bisect.driver import RUN_FILE, resume_bisect, start_bisect
from dsv4bisect.bisect.events import Progress, StepDecided, TrialFinished, TrialStarted
from dsv4bisect.bisect.ledger import Ledger
from dsv4bisect.bisect.rounds import ALONE, TOGETHER
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.search import Status
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.runner import CRASH, FreshLaunch, Runner, TrialResult, TrialRunner
from dsv4bisect.errors import BisectError
from dsv4bisect.policy import TrialPolicy, WarnAs
from dsv4bisect.probe import verdict as V

NAMES = ("a", "b", "c", "d", "e", "f", "g", "h")
NOISELESS = Noise()


class OracleRunner(TrialRunner):
    """Evaluates a patch set against a hidden culprit set, like an engine with a faulty patch.

    Outcomes flip at the given rates, deterministically per (patch set, seed block), so a re-test
    with another seed block can disagree and the same key always gives the same answer."""

    def __init__(
        self,
        culprits: set[str],
        *,
        noise: Noise = NOISELESS,
        probe: str = "oracle-v1",
        verdicts: dict[frozenset[str], list[TrialResult]] | None = None,
        interrupt_at: int | None = None,
        aa: tuple[str, ...] = (),
    ) -> None:
        self.culprits, self.noise, self._probe = frozenset(culprits), noise, probe
        self.verdicts = verdicts or {}
        self.interrupt_at = interrupt_at
        self.aa = aa
        self.calls: list[tuple[frozenset[str], int]] = []
        self.lock = threading.Lock()

    @property
    def probe_hash(self) -> str:
        return self._probe

    def fingerprint(self, patches) -> str:
        return hashlib.sha256(json.dumps(sorted(patches.items())).encode()).hexdigest()[:16]

    def run(self, patches, seed_block, trial_dir):
        on = frozenset(patches)
        with self.lock:
            self.calls.append((on, seed_block))
            if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
                raise KeyboardInterrupt
            scripted = self.verdicts.get(on)
            attempt = sum(1 for s, b in self.calls if s == on and b == seed_block)
        assert trial_dir.is_dir()
        if scripted:
            return scripted[min(attempt, len(scripted)) - 1]
        rng = random.Random(f"{self.fingerprint(patches)}/{seed_block}")
        fails = self.culprits <= on
        flip = rng.random() < (self.noise.false_pass if fails else self.noise.false_fail)
        verdict = V.FAIL if fails != flip else V.PASS
        return TrialResult(verdict, duration_s=1.0, details={"on": sorted(on)}, throughput=42.0,
                           aa_verdicts=self.aa)


def spec(**kwargs) -> BisectSpec:
    base = {"candidates": NAMES, "good": {}, "bad": {n: "on" for n in NAMES}, "noise": NOISELESS}
    return BisectSpec(**{**base, **kwargs})


@pytest.fixture
def ledger(tmp_path):
    with Ledger.open(tmp_path / "ledger.sqlite") as led:
        yield led


def test_finds_the_culprit_and_records_every_step(ledger, tmp_path):
    runner = OracleRunner({"c"})
    events = []
    out = start_bisect(spec(), runner, ledger, tmp_path / "run", events.append)
    assert out.result.status is Status.FOUND and out.result.culprits == {"c"}
    # the search's trials, then the remedy check: the bad end without "c" passes, once
    assert out.remedy is not None and out.remedy.verdict == "passes"
    assert out.remedy.subset == frozenset(NAMES) - {"c"} and out.remedy.trials_run == 1
    assert runner.calls[-1] == (out.remedy.subset, 0)
    assert out.trials_run == len(runner.calls) == len(out.steps) + 1
    assert len(out.steps) == out.result.trials_used
    assert [s.subset for s in out.steps[:2]] == [frozenset(), frozenset(NAMES)]
    kinds = Counter(type(e) for e in events)
    assert kinds[TrialStarted] == kinds[TrialFinished] == kinds[StepDecided] == out.trials_run
    assert isinstance(events[-1], Progress) and events[-1].phase == "done"
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text())["run_id"] == out.run_id
    run = ledger.get_run(out.run_id)
    assert run.status == "found" and run.result["culprits"] == ["c"]
    rows = ledger.trials(out.run_id)
    assert all(r.status == "done" and r.throughput == 42.0 for r in rows)
    assert all(Path(r.trial_dir).is_dir() for r in rows)


def test_a_second_bisect_reuses_every_finished_trial(ledger, tmp_path):
    start_bisect(spec(), OracleRunner({"c", "f"}), ledger, tmp_path / "one")
    again = OracleRunner({"c", "f"})
    out = start_bisect(spec(), again, ledger, tmp_path / "two")
    assert out.result.culprits == {"c", "f"}
    assert again.calls == [] and out.trials_run == 0


def test_warn_counts_as_fail_unless_told_otherwise(ledger, tmp_path):
    warn = TrialResult(V.WARN, duration_s=1.0)

    def runner():
        r = OracleRunner({"none of them"})
        r.verdicts = {s: [warn] for s in _supersets({"e"})}
        return r

    out = start_bisect(spec(), runner(), ledger, tmp_path / "fail")
    assert out.result.culprits == {"e"}
    other = OracleRunner({"none of them"}, probe="oracle-v2")
    other.verdicts = runner().verdicts
    out = start_bisect(spec(), other, ledger, tmp_path / "pass",
                       policy=TrialPolicy(warn_as=WarnAs.PASS))
    assert out.result.status is Status.BAD_END_PASSES


def _supersets(core: set[str]) -> list[frozenset[str]]:
    rest = [n for n in NAMES if n not in core]
    return [
        frozenset(core) | {n for i, n in enumerate(rest) if mask >> i & 1}
        for mask in range(1 << len(rest))
    ]


def test_cannot_test_is_retried_once_then_skipped(ledger, tmp_path):
    infra = TrialResult(V.CANNOT_TEST, duration_s=1.0, details={"why": "port busy"})
    runner = OracleRunner({"b"})
    flaky = frozenset("abcd")  # fails to launch once, then works
    dead = frozenset("efgh")  # never launches
    runner.verdicts = {flaky: [infra, TrialResult(V.FAIL)], dead: [infra, infra]}
    out = start_bisect(spec(), runner, ledger, tmp_path / "run")
    assert out.result.culprits == {"b"}
    outcomes = {s.subset: s.outcome for s in out.steps}
    if flaky in outcomes:
        assert outcomes[flaky] == "fail" and runner.calls.count((flaky, 0)) == 2
    if dead in outcomes:
        assert outcomes[dead] == "skip" and runner.calls.count((dead, 0)) == 2


def test_a_patch_that_crashes_the_engine_is_the_culprit(ledger, tmp_path):
    crash = TrialResult(V.CANNOT_TEST, signature=CRASH, duration_s=1.0)
    runner = OracleRunner({"none of them"})
    runner.verdicts = {s: [crash, crash] for s in _supersets({"g"})}
    out = start_bisect(spec(), runner, ledger, tmp_path / "run")
    assert out.result.status is Status.FOUND and out.result.culprits == {"g"}
    crashed = [s for s in out.steps if s.signature == CRASH]
    assert crashed and all(s.outcome == "fail" for s in crashed)


def test_a_good_end_that_crashes_cannot_be_tested(ledger, tmp_path):
    crash = TrialResult(V.CANNOT_TEST, signature=CRASH, duration_s=1.0)
    runner = OracleRunner({"a"})
    runner.verdicts = {frozenset(): [crash, crash]}
    out = start_bisect(spec(), runner, ledger, tmp_path / "run")
    assert out.result.status is Status.UNTESTABLE
    assert [s.outcome for s in out.steps] == ["skip"]


def test_an_interrupted_bisect_resumes_without_repeating_finished_trials(ledger, tmp_path):
    reference = OracleRunner({"b", "h"})
    expected = start_bisect(spec(), reference, ledger, tmp_path / "ref").result
    with Ledger.open(tmp_path / "fresh.sqlite") as fresh:
        first = OracleRunner({"b", "h"}, interrupt_at=6)
        with pytest.raises(KeyboardInterrupt):
            start_bisect(spec(), first, fresh, tmp_path / "run")
        statuses = Counter(r.status for r in fresh.trials(_run_id(tmp_path / "run")))
        assert statuses == {"done": 5, "aborted": 1}
        second = OracleRunner({"b", "h"})
        out = resume_bisect(tmp_path / "run", second, ledger=fresh)
    assert out.result.culprits == expected.culprits
    finished_before = set(first.calls[:5])
    assert not finished_before & set(second.calls)
    assert second.calls[0] == first.calls[5]  # the interrupted trial runs again
    assert len(first.calls) - 1 + len(second.calls) == len(reference.calls)


def _run_id(run_dir: Path) -> str:
    return json.loads((run_dir / RUN_FILE).read_text())["run_id"]


def test_resume_refuses_a_different_probe(ledger, tmp_path):
    start_bisect(spec(), OracleRunner({"a"}), ledger, tmp_path / "run")
    with pytest.raises(BisectError, match="differs"):
        resume_bisect(tmp_path / "run", OracleRunner({"a"}, probe="other"), ledger=ledger)
    with pytest.raises(BisectError, match="already holds"):
        start_bisect(spec(), OracleRunner({"a"}), ledger, tmp_path / "run")
    with pytest.raises(BisectError, match="not a bisect run directory"):
        resume_bisect(tmp_path / "elsewhere", OracleRunner({"a"}), ledger=ledger)


def test_retests_draw_fresh_seed_blocks(ledger, tmp_path):
    runner = OracleRunner({"d"}, noise=Noise(0.15, 0.15))
    out = start_bisect(spec(noise=Noise(0.15, 0.15)), runner, ledger, tmp_path / "run")
    blocks: dict[frozenset[str], list[int]] = {}
    for s in out.steps:
        blocks.setdefault(s.subset, []).append(s.seed_block)
    assert any(len(b) > 1 for b in blocks.values())  # the noisy search re-tested something
    for b in blocks.values():
        assert b == list(range(len(b)))
    assert len(set(runner.calls)) == len(runner.calls)  # no (patch set, block) twice


def test_noise_evidence_from_ends_and_aa_runs(ledger, tmp_path):
    runner = OracleRunner({"a"}, aa=(V.PASS, V.FAIL))
    out = start_bisect(spec(), runner, ledger, tmp_path / "run")
    est = out.measured_noise
    ends = sum(1 for s in out.steps if s.subset in (frozenset(), frozenset(NAMES)))
    assert est.good_runs == 2 * out.trials_run + sum(1 for s in out.steps if not s.subset)
    assert est.false_fails == out.trials_run  # one failing A/A comparison per trial
    assert est.bad_runs == ends - sum(1 for s in out.steps if not s.subset)


def test_parallel_rounds_run_concurrently_and_find_the_pair(ledger, tmp_path):
    runner = OracleRunner({"a", "d"})
    out = start_bisect(spec(parallel=3), runner, ledger, tmp_path / "run")
    assert out.result.culprits == {"a", "d"}
    assert out.result.trials_used + out.remedy.trials_run == len(runner.calls)


def test_patch_sets_take_bad_variants_for_the_subset_and_good_ones_elsewhere():
    s = BisectSpec(
        candidates=("mma-decode", "trtllm-clamp"),
        good={"mma-decode": "split-k", "mhc-bf16": "bf16", "trtllm-clamp": "alpha"},
        bad={"mma-decode": "merge-no-rescale", "mhc-bf16": "bf16"},
    )
    assert s.patches_for(frozenset()) == s.good
    assert s.patches_for(frozenset({"mma-decode", "trtllm-clamp"})) == {
        "mma-decode": "merge-no-rescale",
        "mhc-bf16": "bf16",
    }
    assert BisectSpec.from_json(s.to_json()) == s
    with pytest.raises(BisectError, match="same at the good and bad ends"):
        BisectSpec(candidates=("mhc-bf16",), good={"mhc-bf16": "bf16"}, bad={"mhc-bf16": "bf16"})


def test_the_oracle_runner_satisfies_the_protocol():
    assert isinstance(OracleRunner(set()), Runner)


class AbortingRunner(OracleRunner):
    """A runner whose command aborts the bisect (exit >= 128) on the bad end."""

    def run(self, patches, seed_block, trial_dir):
        if frozenset(patches) == frozenset(NAMES):
            raise BisectError("the test command exited 130: aborting the bisect", None)
        return super().run(patches, seed_block, trial_dir)


def test_an_abort_in_a_parallel_round_keeps_the_other_trial(ledger, tmp_path):
    with pytest.raises(BisectError, match="aborting"):
        start_bisect(spec(parallel=2), AbortingRunner({"a"}), ledger, tmp_path / "run")
    rows = ledger.trials(_run_id(tmp_path / "run"))
    assert sorted(r.status for r in rows) == ["aborted", "done"]
    assert [r.subset for r in rows if r.status == "done"] == [frozenset()]


class HotOracle(OracleRunner):
    """A hot runner's contract: `confirm` launches fresh; trials of `launched_for` ran in an
    engine launched in exactly that configuration (`fresh_launch` in their details)."""

    def __init__(self, culprits: set[str], launched_for: set[frozenset[str]]) -> None:
        super().__init__(culprits)
        self.launched_for, self.confirmed = launched_for, []

    def run(self, patches, seed_block, trial_dir):
        result = super().run(patches, seed_block, trial_dir)
        fresh = frozenset(patches) in self.launched_for
        return TrialResult(result.verdict, duration_s=1.0, details={"fresh_launch": fresh})

    def confirm(self, patches, seed_block, trial_dir):
        self.confirmed.append(frozenset(patches))
        return super().run(patches, seed_block, trial_dir)

    def fresh_fingerprint(self, patches) -> str:
        return "fresh-" + self.fingerprint(patches)

    hot = True

    def fresh(self):
        return FreshLaunch(self.fresh_fingerprint, self.confirm)


def test_a_failing_trial_launched_in_the_culprits_configuration_is_their_confirmation(
        ledger, tmp_path):
    switched = HotOracle({"c"}, launched_for=set())
    out = start_bisect(spec(), switched, ledger, tmp_path / "switched")
    assert switched.confirmed == [frozenset({"c"})]  # every trial switched: one fresh launch
    assert out.confirmation.agrees and out.confirmation.by_trial is None
    launched = HotOracle({"c"}, launched_for={frozenset({"c"})})
    with Ledger.open(tmp_path / "other.sqlite") as other:
        out = start_bisect(spec(), launched, other, tmp_path / "launched")
    assert frozenset({"c"}) in {on for on, _ in launched.calls}  # the search tried {c} alone
    assert launched.confirmed == []  # ... in its own launch: that trial is the confirmation
    assert out.confirmation.agrees and out.confirmation.by_trial is not None
    assert out.confirmation.to_json()["by_trial"] == out.confirmation.by_trial


class AnyOfRunner(OracleRunner):
    """Patches that each fail on their own: a configuration fails iff it holds any of them."""

    def run(self, patches, seed_block, trial_dir):
        on = frozenset(patches)
        with self.lock:
            self.calls.append((on, seed_block))
        return TrialResult(V.FAIL if on & self.culprits else V.PASS, duration_s=1.0)


def test_three_independently_failing_patches_are_named_as_several(ledger, tmp_path):
    runner = AnyOfRunner({"b", "d", "g"})
    out = start_bisect(spec(), runner, ledger, tmp_path / "run")
    assert out.result.status is Status.SEVERAL, out.result.message
    assert out.result.culprits == {"b", "d", "g"}
    assert "several culprits" in out.result.message
    good = [s.outcome for s in out.steps if not s.subset]
    assert good and all(o == "pass" for o in good)  # so never "the good end fails"
    # the bad end without all three passes
    assert out.remedy is not None and out.remedy.verdict == "passes"
    assert out.remedy.subset == frozenset(NAMES) - {"b", "d", "g"}


def test_by_default_a_warn_is_like_good_when_the_bad_end_loses_facts(ledger, tmp_path):
    # "c" loses facts (FAIL); "e" only drifts (WARN wherever it is on without "c").
    runner = OracleRunner({"c"})
    runner.verdicts = {s: [TrialResult(V.WARN, duration_s=1.0)] for s in _supersets({"e"})
                       if "c" not in s}
    out = start_bisect(spec(), runner, ledger, tmp_path / "run")
    assert out.result.status is Status.FOUND and out.result.culprits == {"c"}


class EndsAloneRunner(OracleRunner):
    """A runner that shards the ends (the Ray runner's `ends_schedule`): records each round."""

    ends_schedule = ALONE

    def __init__(self, culprits: set[str]) -> None:
        super().__init__(culprits)
        self.rounds: list[int] = []
        self.good_blocks: list[int | None] = []

    def begin_round(self, trials: int, good_block: int | None = None) -> None:
        self.rounds.append(trials)
        self.good_blocks.append(good_block)


class EndsTogetherRunner(EndsAloneRunner):
    ends_schedule = TOGETHER


def test_a_runner_that_shards_the_ends_gets_each_end_alone_in_its_round(ledger, tmp_path):
    """bisect/rounds.py: the good end, then the bad end, each alone in its round (every node
    shards it), then rounds of up to --parallel trials; the same culprits as without."""
    runner = EndsAloneRunner({"a", "d"})
    out = start_bisect(spec(parallel=3), runner, ledger, tmp_path / "run")
    assert out.result.culprits == {"a", "d"}
    assert [s for s, _ in runner.calls[:2]] == [frozenset(), frozenset(NAMES)]
    assert runner.rounds[:2] == [1, 1] and max(runner.rounds) == 3
    assert runner.good_blocks[:2] == [0, None]
    ends = {frozenset(), frozenset(NAMES)}
    start = 0
    for size in runner.rounds:  # a round holding an end holds nothing else
        subsets = [s for s, _ in runner.calls[start:start + size]]
        assert size == 1 or not ends & set(subsets), subsets
        start += size


def test_a_runner_that_runs_the_ends_together_gets_both_in_its_first_round(ledger, tmp_path):
    """TOGETHER: the first round is the good end and the bad end, nothing else (the runner is
    told the good end's seed block: the bad end beside it starts ahead of it), then rounds of
    up to --parallel trials; the same culprits as one end at a time."""
    runner = EndsTogetherRunner({"a", "d"})
    out = start_bisect(spec(parallel=3), runner, ledger, tmp_path / "run")
    assert out.result.culprits == {"a", "d"}
    assert {s for s, _ in runner.calls[:2]} == {frozenset(), frozenset(NAMES)}
    assert runner.rounds[0] == 2 and runner.good_blocks[0] == 0
    assert max(runner.rounds) == 3


def test_a_confirm_round_with_an_idle_slot_runs_the_remedy_check_in_it(ledger, tmp_path):
    """--parallel 3, culprits {b, h}: a round of the confirm phase holds fewer checks than
    slots, so the bad end without the lead runs in it as a search trial, and the remedy check
    counts it instead of a round of its own (Search._propose_checks)."""
    runner = OracleRunner({"b", "h"})
    out = start_bisect(spec(parallel=3), runner, ledger, tmp_path / "run")
    rest = frozenset(NAMES) - {"b", "h"}
    assert out.result.culprits == {"b", "h"} and out.remedy.verdict == "passes"
    assert out.remedy.trials_run == 0 and any(s.subset == rest for s in out.steps)
