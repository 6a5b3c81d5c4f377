"""The bisect loop: ask the search, look up the ledger, run what is missing, record, repeat.

Everything that touches the outside world is here; the search stays pure. The driver decides
what a trial means for the search: a drift WARN counts by the trial policy's rule
(`TrialPolicy.warn_fails`: by default like the bad end where the bad end's own first
measurement only drifts, like the good end where it loses facts; the bad end's verdict is read
from the ledger, so the order in which trials are decided never changes an outcome);
CANNOT_TEST is retried once, then SKIP (routed around); two crashes of a configuration are a
FAIL with signature "crash" (at the good end they are SKIP: the good end must be testable).
After a `found` result the remedy check (remedy.py) runs the bad end without the culprits.
A resume replays the ledger into a fresh search; the search is deterministic given its
records, so the same trials come back in the same order and none is run twice (but a
configuration that only failed to test, which it tries again: `_decide`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dsv4bisect.base import atomic
from dsv4bisect.base.bounded import load_json
from dsv4bisect.base.storage import resume_hint, storage_failure
from dsv4bisect.bisect import end_looks
from dsv4bisect.bisect import remedy as rem
from dsv4bisect.bisect.events import (
    Event,
    StepDecided,
    TrialFinished,
    TrialStarted,
    progress_of,
    result_json,
)
from dsv4bisect.bisect.evidence import record_noise_evidence
from dsv4bisect.bisect.ledger import Ledger, NoiseEstimate, StepRow, TrialKey
from dsv4bisect.bisect.rounds import BESIDE, ends_round
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.search import Search, SearchResult, Status
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.runner import CRASH, FreshLaunch, Runner, TrialResult
from dsv4bisect.errors import BisectError, ConfigError
from dsv4bisect.policy import DEFAULT_POLICY, TrialPolicy
from dsv4bisect.probe import verdict as V

RUN_FILE = "bisect.json"  # in the run directory: the run id and the ledger it lives in


@dataclass(frozen=True)
class BisectOutcome:
    run_id: str
    run_dir: Path
    spec: BisectSpec
    result: SearchResult
    steps: tuple[StepRow, ...]  # the search's records, in order (report: every trial)
    trials_run: int  # trials this invocation launched (the rest came from the ledger)
    measured_noise: NoiseEstimate
    remedy: rem.Remedy | None = None  # the bad end without the culprits (remedy.py)
    confirmation: Confirmation | None = None  # hot mode: the culprits in a fresh launch


@dataclass(frozen=True)
class Confirmation:
    """The culprits switched on against the good end in a fresh launch (the deployment's own
    graph mode), after a search that ran hot. `agrees` is False when the fresh launch passes:
    the hot result and the fresh one disagree, and the report says so."""

    subset: frozenset[str]
    outcomes: tuple[str, ...]
    skipped: str | None = None  # why no confirmation ran (`--no-confirm`, ...)
    by_trial: int | None = None  # a search trial that already was that fresh launch (its id)

    @property
    def agrees(self) -> bool | None:
        seen = [o for o in self.outcomes if o in (V.PASS, V.FAIL)]
        return None if not seen else seen[-1] == V.FAIL

    def to_json(self) -> dict[str, Any]:
        return {"subset": sorted(self.subset),
                "outcomes": [V.SEARCH_WORDS[o] for o in self.outcomes],
                "agrees": self.agrees, "skipped": self.skipped, "by_trial": self.by_trial}


@dataclass(frozen=True)
class _Slot:
    step: int
    subset: frozenset[str]
    seed_block: int
    key: TrialKey
    patches: dict[str, str]
    remedy: bool = False  # a remedy-check trial: labelled as such, not a search step
    fresh: bool = False  # the fresh-launch confirmation of a hot search (runner.confirm)


@dataclass(frozen=True)
class _Decision:
    outcome: str
    signature: str | None
    trial_id: int | None
    reused: bool
    noise: Noise | None = None  # the error rates the verdict holds to, where it states them
    # a bad end's trial whose look 1 established its loss (end_looks.settles: accuracy or
    # signatures), so a trial probed at that look beside it misses the loss no more often
    settled_at_look1: bool = False


def beside_rates(slots: Sequence[_Slot], decisions: Sequence[_Decision],
                 everything: frozenset[str], noise: Noise) -> list[_Decision]:
    """The round's decisions, each trial beside the ends (bisect/rounds.py BESIDE: a full probe
    of the ends' look, started with them) holding to that look's rates where the bad end of its
    seed block, in the same round, established its loss at look 1: its false pass is look 1's
    chance of missing the smallest loss of the verdict table (`end_looks.LOOK2_RISK`, what look
    1 is sized for), its false fail the bisect's for a full probe (`noise`). Where the bad
    end's look 1 did not settle, the loss is smaller than look 1 is sized for, and they keep the
    bisect's full-probe rates (no stated rates), as every other trial does."""
    out = list(decisions)
    settled = {s.seed_block for s, d in zip(slots, decisions)
               if s.subset == everything and d.settled_at_look1}
    goods = {s.seed_block for s in slots if not s.subset}
    for i, (slot, decision) in enumerate(zip(slots, decisions)):
        if (slot.subset and slot.subset != everything and slot.seed_block in settled & goods
                and decision.noise is None and decision.outcome in (V.PASS, V.FAIL)):
            out[i] = replace(decision, noise=end_looks.beside_trial_rates(noise))
    return out


def start_bisect(
    spec: BisectSpec,
    runner: Runner,
    ledger: Ledger,
    run_dir: str | Path,
    on_event: Callable[[Event], None] | None = None,
    request: Mapping[str, Any] | None = None,
    policy: TrialPolicy = DEFAULT_POLICY,
) -> BisectOutcome:
    """Start a bisect in `run_dir` (created), recorded in `ledger`. `request` (JSON-able: what
    the caller needs to rebuild its runner on resume) is kept in the run file, with the trial
    `policy` in it (a resume counts verdicts by the same rules). With a runner that can
    (`fresh`), the culprits are confirmed in a fresh launch after a hot search unless
    `spec.confirm` is False (`--no-confirm`: the result says it was skipped)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / RUN_FILE).exists():
        raise BisectError(f"`{run_dir}` already holds a bisect", "resume it with --resume")
    stored = {**dict(request or {}), "policy": policy.to_json()}
    if request is not None and request.get("policy", stored["policy"]) != stored["policy"]:
        raise ValueError("the request's trial policy is not the one the bisect runs by")
    settings = {**spec.to_json(), "probe": runner.probe_hash}
    run_id = ledger.create_run(run_dir, settings)
    info = {"run_id": run_id, "ledger": str(ledger.path.resolve()), "request": stored}
    # the request is what --resume replays, secrets included (a --set token, a test command's
    # --api-key): readable by its owner only; every output of it is redacted
    atomic.write_json(run_dir / RUN_FILE, info, private=True)
    return _Driver(spec, policy, runner, ledger, run_id, run_dir, on_event).drive()


def resume_bisect(
    run_dir: str | Path,
    runner: Runner,
    on_event: Callable[[Event], None] | None = None,
    ledger: Ledger | None = None,
) -> BisectOutcome:
    """Continue the bisect of `run_dir`; finished trials are reused, interrupted ones re-run,
    verdicts counted by the trial policy its run file's request holds. Without `ledger`, the
    ledger named in the run directory is opened (and closed)."""
    run_dir = Path(run_dir)
    info = read_run_file(run_dir)
    own = ledger is None
    ledger = ledger or Ledger.open(info["ledger"])
    try:
        run = ledger.get_run(info["run_id"])
        if run.settings.get("probe") != runner.probe_hash:
            raise BisectError(
                "the probe (or test command) differs from the one this bisect started with",
                "start a new bisect, or resume with the same one",
            )
        spec = BisectSpec.from_json(run.settings)
        policy = TrialPolicy.from_json(info.get("request") or {})
        ledger.abandon_running(run.id)
        ledger.clear_steps(run.id)
        return _Driver(spec, policy, runner, ledger, run.id, run_dir, on_event,
                       before_trials=lambda: _check_replayable(info, run_dir)).drive()
    finally:
        if own:
            ledger.close()


def read_run_file(run_dir: str | Path) -> dict[str, Any]:
    """The run file of a bisect run directory: run id, ledger path, the caller's request."""
    path = Path(run_dir) / RUN_FILE
    try:
        info = load_json(path, "run")
        if not isinstance(info, dict) or "run_id" not in info or "ledger" not in info:
            raise ValueError("no run id or ledger in it")
    except (OSError, ValueError, ConfigError) as exc:
        raise BisectError(
            f"`{run_dir}` is not a bisect run directory ({exc})",
            f"pass the directory that holds {RUN_FILE}",
        ) from exc
    damaged = _damaged_field(info)
    if damaged:
        raise BisectError(f"{path}: {damaged}",
                          "the file was edited or truncated; it cannot be reported or resumed")
    return info


def _check_replayable(info: dict[str, Any], run_dir: Path) -> None:
    """What the request replays must still exist: a test command runs in its recorded working
    directory, and one that is gone would make every remaining trial a CANNOT_TEST `not-run`
    (a resume spent 49 of them before giving up): one error, before the first trial a resume
    runs (a finished bisect's resume, which runs none, still reports)."""
    cwd = (info.get("request") or {}).get("test_cwd")
    if info.get("request", {}).get("test_cmd") and isinstance(cwd, str) \
            and not Path(cwd).is_dir():
        raise BisectError(
            f"`{run_dir}` runs its test command in `{cwd}`, which no longer exists",
            f"recreate `{cwd}` with the test command's files, or start a new bisect from "
            "where they are now (the ledger keeps every finished trial)")


# The fields of bisect.json that a report or a resume reads, with the JSON types they must
# have (a hand-edited `"ledger": 5` or `"request": "x"` is an error naming the field).
_REQUEST_FIELDS: dict[str, tuple[type, ...]] = {
    "test_cmd": (str, list, type(None)), "test_cwd": (str, type(None)),
    "profile": (str, type(None)), "sets": (list, type(None)), "command": (list, type(None)),
    "executor": (str, type(None)), "tier": (str, type(None)), "policy": (dict, type(None))}


def _damaged_field(info: dict[str, Any]) -> str | None:
    for key in ("run_id", "ledger"):
        if not isinstance(info[key], str) or not info[key]:
            return f"`{key}` is not a non-empty string"
    request = info.get("request")
    if request is None:
        return None
    if not isinstance(request, dict):
        return "`request` is not an object"
    for key, types in _REQUEST_FIELDS.items():
        value = request.get(key)
        if not isinstance(value, types) or isinstance(value, bool):
            return f"`request.{key}` has the wrong type ({type(value).__name__})"
        if isinstance(value, list) and not all(isinstance(x, str) for x in value):
            return f"`request.{key}` holds a value that is not a string"
    try:
        TrialPolicy.from_json(request)
    except (KeyError, TypeError, ValueError) as exc:
        return f"`request.policy` cannot be read ({type(exc).__name__}: {str(exc)[:80]})"
    return None


class _Driver:
    def __init__(
        self,
        spec: BisectSpec,
        policy: TrialPolicy,
        runner: Runner,
        ledger: Ledger,
        run_id: str,
        run_dir: Path,
        on_event: Callable[[Event], None] | None,
        before_trials: Callable[[], None] | None = None,
    ) -> None:
        self.spec, self.policy, self.runner, self.ledger = spec, policy, runner, ledger
        self._before_trials = before_trials  # raises when trials cannot run (once, first)
        self.run_id, self.run_dir = run_id, run_dir
        self.emit = on_event or (lambda event: None)
        self.trials_run = 0
        self.launched: set[int] = set()  # trial ids run by this invocation
        self._bad_key: TrialKey | None = None  # the bad end's first measurement (seed block 0)

    def drive(self) -> BisectOutcome:
        """The bisect to its end; a full disk or a lost permission on the way is a
        StorageError (exit 125) whose hint is this bisect's `--resume`."""
        try:
            return self._drive()
        except Exception as exc:
            storage = storage_failure(exc, resume_hint(self.run_dir))
            if storage is None:
                raise
            raise storage from exc

    def _drive(self) -> BisectOutcome:
        search = self.spec.search()
        seen: Counter[frozenset[str]] = Counter()
        step = 0
        pool = ThreadPoolExecutor(self.spec.parallel) if self.spec.parallel > 1 else None
        clean = False
        try:
            step = self._search_rounds(search, search.next, seen, step, pool)
            remedy = self._remedy(search, step, seen, pool)
            step += remedy.trials_run if remedy else 0
            if remedy is not None and remedy.verdict == rem.FAILS:
                # Another culprit remains: run every candidate alone, so patches that each fail
                # on their own are named as several culprits (search.py, "several culprits"),
                # then check the bad end without all of them.
                step = self._search_rounds(search, search.singles_to_test, seen, step, pool)
                if search.result().status is Status.SEVERAL:
                    remedy = self._remedy(search, step, seen, pool)
                    step += remedy.trials_run if remedy else 0
            confirmation = self._confirmation(search, step, seen)
            clean = True
        finally:
            if pool is not None:  # on an error, do not wait for the other workers
                pool.shutdown(wait=clean, cancel_futures=not clean)
        return self._finish(search, remedy, confirmation)

    def _search_rounds(self, search: Search, propose: Callable[[], list[frozenset[str]]],
                       seen: Counter[frozenset[str]], step: int,
                       pool: ThreadPoolExecutor | None) -> int:
        """Run what `propose` asks for, round by round, recording each outcome in the search
        and the ledger; returns the next step number."""
        schedule = self.runner.ends_schedule  # bisect/rounds.py
        while proposals := propose():
            proposals = ends_round(proposals, frozenset(self.spec.candidates), schedule)
            self.emit(progress_of(search))
            slots = []
            for subset in proposals:
                slots.append(self._slot(step, subset, seen[subset]))
                seen[subset] += 1  # a re-test in this bisect draws the next seed block
                step += 1
            decisions = self._run_round(slots, pool)
            if schedule == BESIDE:
                decisions = beside_rates(slots, decisions,
                                         frozenset(self.spec.candidates), search.noise)
            for slot, decision in zip(slots, decisions):
                search.record(slot.subset, decision.outcome, noise=decision.noise)
                self.ledger.put_step(
                    self.run_id,
                    StepRow(
                        slot.step,
                        slot.subset,
                        slot.seed_block,
                        V.SEARCH_WORDS[decision.outcome],
                        decision.signature,
                        decision.trial_id,
                    ),
                )
                self.emit(
                    StepDecided(
                        slot.step,
                        slot.subset,
                        slot.seed_block,
                        decision.outcome,
                        decision.signature,
                        decision.reused,
                    )
                )
        return step

    def _remedy(self, search: Search, step: int, seen: Counter[frozenset[str]],
                pool: ThreadPoolExecutor | None) -> rem.Remedy | None:
        """After a culprit set is found: the bad end without it (remedy.py). Its trials are
        keyed in the ledger like any other (a resume repeats none) but are not search records."""
        result = search.result()
        subset = rem.remedy_subset(self.spec.candidates, result.culprits)
        if result.status not in (Status.FOUND, Status.SEVERAL) or not subset:
            return None
        outcomes = rem.prior_outcomes(search.records, subset)
        own = 0
        while rem.needs_more(outcomes, own):
            slot = self._slot(step, subset, seen[subset], remedy=True)
            seen[subset] += 1
            step += 1
            own += 1
            decision = self._run_round([slot], pool)[0]
            outcomes.append(decision.outcome)
            self.emit(StepDecided(slot.step, slot.subset, slot.seed_block, decision.outcome,
                                  decision.signature, decision.reused, remedy=True))
        return rem.Remedy(subset, tuple(outcomes), own)

    def _confirmation(self, search: Search, step: int,
                      seen: Counter[frozenset[str]]) -> Confirmation | None:
        """After a hot search: the culprits on against the good end, in a fresh launch; run
        until PASS/FAIL (a CANNOT_TEST is retried once by `_run_round`). A search trial of
        exactly that configuration that was a fresh launch and failed is that confirmation
        already: nothing more is launched."""
        result = search.result()
        if result.status is not Status.FOUND or not result.culprits:
            return None
        subset = frozenset(result.culprits)
        if not self.runner.hot:  # a runner whose trials are all fresh launches
            return None
        earlier = self._fresh_trial(subset, seen)
        if earlier is not None:
            return Confirmation(subset, (V.FAIL,), by_trial=earlier)
        if self.runner.fresh() is None:  # a hot executor that cannot launch fresh
            return Confirmation(subset, (), skipped="this executor cannot launch fresh")
        if not self.spec.confirm:
            return Confirmation(subset, (), skipped="--no-confirm")
        slot = self._slot(step, subset, seen[subset], fresh=True)
        seen[subset] += 1
        decision = self._run_round([slot], None)[0]
        self.emit(StepDecided(slot.step, slot.subset, slot.seed_block, decision.outcome,
                              decision.signature, decision.reused, confirmation=True))
        return Confirmation(subset, (decision.outcome,))

    def _fresh_trial(self, subset: frozenset[str], seen: Counter[frozenset[str]]) -> int | None:
        """The id of a finished trial of `subset` that ran in an engine launched in exactly
        that configuration and never switched before its probe (HotEngineRunner's
        `fresh_launch`) and came out like the bad end; None if there is none."""
        for block in range(seen[subset]):
            row = self.ledger.definitive(self._slot(0, subset, block).key)
            if (row is not None and row.details.get("fresh_launch")
                    and self._outcome(row.verdict) == V.FAIL):
                return row.id
        return None

    def _slot(self, step: int, subset: frozenset[str], block: int, *,
              remedy: bool = False, fresh: bool = False) -> _Slot:
        patches = self.spec.patches_for(subset)
        fingerprint = self._fresh().fingerprint(patches) if fresh else \
            self.runner.fingerprint(patches)
        key = TrialKey(fingerprint, self.runner.probe_hash, block)
        return _Slot(step, subset, block, key, patches, remedy, fresh)

    def _fresh(self) -> FreshLaunch:
        fresh = self.runner.fresh()
        if fresh is None:  # _confirmation asks first
            raise BisectError("this runner cannot launch fresh", None)
        return fresh

    def _run_round(self, slots: list[_Slot], pool: ThreadPoolExecutor | None) -> list[_Decision]:
        decided: dict[int, _Decision] = {}
        while True:
            todo = []
            for slot in slots:
                if slot.step not in decided:
                    decision = self._decide(slot)
                    if decision is None:
                        todo.append(slot)
                    else:
                        decided[slot.step] = decision
            if not todo:
                return [decided[s.step] for s in slots]
            self._launch(todo, pool)

    def _decide(self, slot: _Slot) -> _Decision | None:
        """The outcome of a slot from the ledger, or None when a trial must run. Two attempts
        of this invocation that did not test are a SKIP; an earlier invocation's count only
        where they are crashes of a candidate (the configuration's own outcome): a resume
        never replays a conclusion reached only through CANNOT_TEST (an engine killed idle, a
        full disk: nothing was measured), it tries again (docs/reliability.md, issue 40)."""
        done = self.ledger.definitive(slot.key)
        if done is not None:
            reused = done.id not in self.launched
            rates = done.details.get("error_rates")
            noise = Noise(*rates) if rates else None
            settled = (done.details.get("end_look") == 1
                       and done.details.get("settled_by") in end_looks.LOSS_SETTLES)
            return _Decision(self._outcome(done.verdict), done.signature, done.id, reused, noise,
                             settled)
        attempts = [a for a in self.ledger.attempts(self.run_id, slot.key)
                    if a.id in self.launched or (slot.subset and a.signature == CRASH)]
        if len(attempts) < 2:
            return None
        last = attempts[-1]
        crashed = all(a.signature == CRASH for a in attempts)
        if crashed and slot.subset:  # a patch that crashes the engine is a culprit
            return _Decision(V.FAIL, CRASH, last.id, False)
        return _Decision(V.CANNOT_TEST, last.signature, last.id, False)

    def _outcome(self, verdict: str | None) -> str:
        """What a trial's verdict is for the search (a WARN by the trial policy's rule)."""
        if verdict == V.BETWEEN:
            return V.BETWEEN
        if verdict == V.WARN:
            return V.FAIL if self.policy.warn_fails(self._bad_end_only_drifts()) else V.PASS
        return V.PASS if verdict == V.PASS else V.FAIL

    def _bad_end_only_drifts(self) -> bool:
        """Whether the bad end's own first measurement (seed block 0) is a drift WARN: read
        from the ledger, so every trial is counted by the same rule, whatever the order in
        which the driver (or a resume) decides them; False while it is not measured."""
        if self._bad_key is None:
            self._bad_key = self._slot(0, frozenset(self.spec.candidates), 0).key
        row = self.ledger.definitive(self._bad_key)
        return row is not None and row.verdict == V.WARN

    def _launch(self, slots: list[_Slot], pool: ThreadPoolExecutor | None) -> None:
        if self._before_trials is not None:
            self._before_trials()
            self._before_trials = None
        started = []
        for slot in slots:
            attempt = len(self.ledger.attempts(self.run_id, slot.key)) + 1
            trial_dir = (
                self.run_dir
                / "trials"
                / f"{slot.step:03d}-{slot.key.fingerprint[:8]}-b{slot.seed_block}-a{attempt}"
            )
            trial_dir.mkdir(parents=True, exist_ok=True)
            trial_id = self.ledger.start_trial(
                self.run_id, slot.step, slot.key, attempt, slot.patches, slot.subset, str(trial_dir)
            )
            self.emit(
                TrialStarted(
                    slot.step, slot.subset, dict(slot.patches), slot.seed_block, attempt, trial_dir,
                    slot.remedy, slot.fresh,
                )
            )
            started.append((slot, attempt, trial_id, trial_dir))
        # idle nodes may shard a probe; a bad end beside the good end starts ahead of it
        good = next((s.seed_block for s, *_ in started if not s.subset), None)
        self.runner.begin_round(len(started), good)
        if pool is None:
            for slot, attempt, trial_id, trial_dir in started:
                try:
                    result = self._call(slot, trial_dir)
                except BaseException:
                    self.ledger.abort_trial(trial_id)
                    raise
                self._store(slot, attempt, trial_id, result)
            return
        futures = [pool.submit(self._call, s, d) for s, _, _, d in started]
        error: Exception | None = None
        pending = {trial_id for _, _, trial_id, _ in started}
        try:
            for (slot, attempt, trial_id, _), future in zip(started, futures):
                try:
                    result = future.result()
                except Exception as exc:  # noqa: BLE001 - keep the others finished, re-raise
                    error = error or exc
                    continue
                self._store(slot, attempt, trial_id, result)
                pending.discard(trial_id)
        finally:  # an error, or Ctrl-C while waiting: unfinished trials run again on resume
            for trial_id in sorted(pending):
                self.ledger.abort_trial(trial_id)
        if error is not None:
            raise error

    def _call(self, slot: _Slot, trial_dir: Path) -> TrialResult:
        run = self._fresh().run if slot.fresh else self.runner.run
        return run(dict(slot.patches), slot.seed_block, trial_dir)

    def _store(self, slot: _Slot, attempt: int, trial_id: int, result: TrialResult) -> None:
        details = dict(result.details)
        if result.error_rates is not None:  # what the search weighs this verdict with
            details["error_rates"] = list(result.error_rates)
        if result.requests is not None:
            details["requests"] = result.requests
        self.ledger.finish_trial(
            trial_id,
            result.verdict,
            result.signature,
            details,
            result.duration_s,
            result.throughput,
            result.log_path,
        )
        for aa in result.aa_verdicts:
            if aa != V.CANNOT_TEST:
                self.ledger.add_noise_evidence(
                    self.runner.probe_hash,
                    "aa",
                    "pass",
                    V.SEARCH_WORDS[self._outcome(aa)],
                    fingerprint=slot.key.fingerprint,
                    run_id=self.run_id,
                    trial_id=trial_id,
                )
        self.trials_run += 1
        self.launched.add(trial_id)
        self.emit(TrialFinished(slot.step, slot.subset, slot.seed_block, attempt, result,
                                slot.remedy, slot.fresh))

    def _finish(self, search: Search, remedy: rem.Remedy | None,
                confirmation: Confirmation | None) -> BisectOutcome:
        result = search.result()
        self.emit(progress_of(search))
        steps = tuple(self.ledger.steps(self.run_id))
        if result.status is not Status.RUNNING:
            doc = result_json(result)
            doc["remedy"] = remedy.to_json() if remedy is not None else None
            doc["confirmation"] = confirmation.to_json() if confirmation is not None else None
            self.ledger.finish_run(self.run_id, result.status.value, doc)
            if search.ends_known and not self.ledger.has_noise_evidence(self.run_id):
                record_noise_evidence(
                    self.ledger,
                    self.runner.probe_hash,
                    self.run_id,
                    self.spec.candidates,
                    result,
                    steps,
                )
        return BisectOutcome(
            self.run_id,
            self.run_dir,
            self.spec,
            result,
            steps,
            self.trials_run,
            self.ledger.measured_noise(self.runner.probe_hash),
            remedy,
            confirmation,
        )
