"""One candidate judged against its good end: the arms, the schedule, the probe runs.

Schedules:
- cached baseline: only the candidate's engine; it replays the cached baseline's requests.
- overlapped (the embedded engine with automatic ports; `can_overlap`): both engines start at
  once; while the baseline is probed, the candidate builds the same cases on its own engine and
  probes its accuracy requests (`pipeline.py`); then the A/A repeat runs beside the candidate's
  drift scoring. Two single-threaded engines keep both cores busy from start to end.
- sequential (anything else: SGLang on its GPUs, fixed ports, `command` engines): good end
  (probe, repeat, stop), then the candidate.

Whatever goes wrong with one arm becomes the trial's verdict (`guard`, the hot runner's too): a repeated candidate
crash FAILs with the signature `crash`, a repeated good-end crash or any infrastructure error is
CANNOT_TEST.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.errors import Dsv4BisectError, EngineError, ProbeError
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import ProbeProgress, collect, collect_sharded, judge
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.run import baseline as cache
from dsv4bisect.run import candidate_cache, pipeline
from dsv4bisect.run.arm import ArmCrashed, Cancelled, EngineArm, Supervisor
from dsv4bisect.run.crash import cannot_test_verdict, crash_verdict, good_end_crash_verdict
from dsv4bisect.run.ends import Ends
from dsv4bisect.run.events import EventSink, Notice, ProbeEvent
from dsv4bisect.run.record import RunRecord
from dsv4bisect.run.signals import check_interrupt
from dsv4bisect.run.threads import Background, deferred

T = TypeVar("T")
LABELS = {"baseline": "baseline", "repeat": "A/A repeat", "candidate": "candidate",
          "candidate-drift": "candidate drift", "cases": "candidate"}


class Stop(Exception):
    """Ends the trial early with a verdict that is not the judge's (crash, cannot test)."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.verdict)
        self.verdict = verdict


def can_overlap(good: EngineConfig, cand: EngineConfig) -> bool:
    """Two engines at once: only the embedded engine (small), with ports chosen at launch."""
    return all(c.kind == "reference" and all(p.port is None for p in c.processes)
               for c in (good, cand))


@dataclass
class Trial:
    ends: Ends
    spec: ProbeSpec
    run_dir: Path
    record: RunRecord
    supervisor: Supervisor
    on_event: EventSink
    api_key: str | None
    use_cache: bool
    # `run`'s trial keeps its candidate for the bisect that follows (run/candidate_cache.py)
    cache_candidate: bool = False
    base: ProbeRun | None = None
    repeat: ProbeRun | None = None
    cand: ProbeRun | None = None
    arms: dict[str, EngineArm] = field(default_factory=dict)
    entry: cache.CachedBaseline | None = None  # the baseline's cache entry (reused or stored)

    def run(self) -> Verdict:
        for name, cfg in (("baseline", self.ends.good), ("candidate", self.ends.candidate)):
            self.arms[name] = EngineArm(name, cfg, self.run_dir / name, self.supervisor,
                                        self.on_event)
        try:
            self._schedule()
        except Stop as stop:
            return stop.verdict
        assert self.base is not None and self.cand is not None
        if self.cache_candidate:
            self._store_candidate()
        return judge(self.base, self.repeat, self.cand)

    def stop(self) -> None:
        """Stop every engine and record what each arm went through."""
        self.supervisor.stop_all()
        for name, arm in self.arms.items():
            self.record.update_arm(name, attempts=arm.attempts, launch_s=arm.launch_s,
                                   crashes=[c.to_dict() for c in arm.crashes],
                                   port_retries=arm.port_retries, verified=arm.verified)
        self.record.save()

    # -- schedules ---------------------------------------------------------------------------
    def _schedule(self) -> None:
        key = cache.BaselineKey.of(self.ends.good.fingerprint, self.spec)
        hit, why = cache.lookup(key) if self.use_cache else (None, None)
        if why:
            self.record.note(why)
            self.on_event(Notice(why, "warn"))
        if hit is not None:
            self.entry = hit
            self._reuse(hit)
            self.cand = self._candidate(lambda: self._stage("candidate", self.base))
        elif can_overlap(self.ends.good, self.ends.candidate):
            self.record.time("overlapped", True)
            self._overlapped(key)
        else:
            self._sequential(key)

    def _sequential(self, key: cache.BaselineKey) -> None:
        good = self.arms["baseline"]
        self._guard(good, good.spawn)
        self.base = self._stage("baseline", None)
        self.repeat = self._repeat()
        good.stop()
        self._store(key)
        self.cand = self._candidate(lambda: self._stage("candidate", self.base))

    def _overlapped(self, key: cache.BaselineKey) -> None:
        good, cand = self.arms["baseline"], self.arms["candidate"]
        self._guard(good, good.spawn)
        self._guard(cand, cand.spawn)
        t0 = time.perf_counter()
        early = Background(self._early_candidate, "candidate-accuracy")
        self.base = self._stage("baseline", None)
        side = Background(self._repeat, "aa-repeat")
        # A candidate that crashes or cannot be tested still lets the repeat finish (and cache).
        cand_result = deferred(lambda: self._candidate(lambda: self._late(early, t0)),
                               passthrough=(Cancelled,))
        self.repeat = side.result()
        self._store(key)
        self.cand = cand_result()

    def _early_candidate(self) -> tuple[ProbeRun, ProbeRun]:
        """Beside the baseline probe: build the cases on the candidate's engine (the same
        tokenizer gives the same cases; `_late` checks) and probe its accuracy requests."""
        cand = self.arms["candidate"]
        cases = self._guard(cand, lambda: cand.probe(lambda url: pipeline.case_reference(
            url, self.spec, api_key=self.api_key, model=cand.cfg.served_model_name,
            on_progress=self._progress("cases"))))
        return cases, self._collect("candidate", cases)

    def _late(self, early: Background[tuple[ProbeRun, ProbeRun]], t0: float) -> ProbeRun:
        """After the baseline: the candidate's accuracy part (from `early`), then its drift part."""
        assert self.base is not None
        cases, accuracy = early.result()
        if not pipeline.same_cases(cases, self.base):
            note = ("the cases built on the candidate's engine differ from the baseline's (another "
                    "tokenizer or template?); the candidate was probed again with the baseline's")
            self.record.note(note)
            self.on_event(Notice(note, "warn"))
            return self._stage("candidate", self.base)
        ref = pipeline.drift_reference(self.base)
        drift = self._collect("candidate-drift", ref) if ref is not None else None
        run = pipeline.merge(self.base, accuracy, drift).save(self.run_dir / "candidate")
        self.record.time("candidate_s", time.perf_counter() - t0)
        self.record.save()
        return run

    # -- stages ------------------------------------------------------------------------------
    def _reuse(self, hit: cache.CachedBaseline) -> None:
        self.base, self.repeat = hit.install(self.run_dir / "baseline",
                                             self.run_dir / "baseline-repeat")
        _, subset = cache.repeat_reference(self.base)
        self.record.set("aa", {"repeat": self.repeat is not None, "subset": subset})
        self.record.update_arm("baseline", cached={"path": str(hit.path),
                                                   "created_at": hit.created_at,
                                                   "source_run": hit.source_run})
        self.on_event(Notice(f"baseline reused from the cache ({hit.path}, made "
                             f"{hit.created_at}); --no-cache measures it again"))

    def _repeat(self) -> ProbeRun:
        assert self.base is not None
        reference, subset = cache.repeat_reference(self.base)
        self.record.set("aa", {"repeat": True, "subset": subset})
        if subset:  # why its request count is not the baseline's (the verdict counts the same)
            self.on_event(Notice(subset))
        return self._stage("repeat", reference, note=subset, out="baseline-repeat")

    def _stage(self, key: str, reference: ProbeRun | None, note: str | None = None,
               out: str | None = None) -> ProbeRun:
        """One collect on the arm it belongs to, saved into the run directory and timed."""
        t0 = time.perf_counter()
        run = self._collect(key, reference)
        if note:
            run = replace(run, notes=(*run.notes, note))
        saved = run.save(self.run_dir / (out or key))
        self.record.time(f"{key}_s", time.perf_counter() - t0)
        self.record.save()
        return saved

    def _collect(self, key: str, reference: ProbeRun | None) -> ProbeRun:
        arm = self.arms["candidate" if key.startswith("candidate") else "baseline"]
        return self._guard(arm, lambda: collect_on(arm, self.spec, reference, self.api_key,
                                                   self._progress(key)))

    def _progress(self, key: str) -> Callable[..., None]:
        label = LABELS[key]
        if self.ends.candidate.fingerprint == self.ends.good.fingerprint:
            # a bisect's check of the good end (or `run --only none`): its requests are the good
            # end's, not a candidate's
            label = label.replace("candidate", "good end")
        return probe_progress(self.on_event, label)

    def _candidate(self, work: Callable[[], T]) -> T:
        """The candidate's work; a crash on every attempt is the trial's verdict (FAIL crash)."""
        try:
            return work()
        except ArmCrashed as exc:
            if self.record.arm("baseline")["cached"]:
                note = "the good end (cached baseline) ran without crashing"
            elif self.arms["baseline"].crashes:
                note = "the good end crashed once but ran on its relaunch"
            else:
                note = "the good end ran without crashing"
            raise Stop(crash_verdict(self.spec, exc.crashes, note)) from None

    def _guard(self, arm: EngineArm, work: Callable[[], T]) -> T:
        return guard(self.spec, arm, work, good_end=arm.name == "baseline")

    def _store(self, key: cache.BaselineKey) -> None:
        # Only a baseline measured on a server proven to be the good end's own engine is reused
        # by later runs (a foreign server's answers must not outlive this run).
        if self.arms["baseline"].verified is not True:
            self.record.note("baseline not cached: the server that answered could not be "
                             "checked to be the good end's own engine")
            return
        try:
            path = cache.store(key, self.run_dir / "baseline", self.run_dir / "baseline-repeat")
        except OSError as exc:  # a full or read-only cache must not fail a finished trial
            self.record.note(f"baseline not cached: {exc}")
            return
        self.record.note(f"baseline cached at {path}")
        self.entry, _ = cache.lookup(key)

    def _store_candidate(self) -> None:
        # Like the baseline: only a fresh launch that finished its probe without a crash, on a
        # server proven to be the candidate's own engine, judged against a cached baseline
        # (the bisect's bad end is used only beside that very good end).
        arm = self.arms["candidate"]
        if self.entry is None or arm.verified is not True or arm.crashes:
            self.record.note("candidate not cached: " + (
                "its baseline is not cached" if self.entry is None else
                "it crashed on the way" if arm.crashes else
                "the server that answered could not be checked to be its own engine"))
            return
        key = cache.BaselineKey.of(self.ends.candidate.fingerprint, self.spec)
        try:
            path = candidate_cache.store(key, self.run_dir / "candidate", self.entry)
        except OSError as exc:
            self.record.note(f"candidate not cached: {exc}")
            return
        self.record.note(f"candidate cached at {path} (a bisect's bad end of seed block "
                         f"{self.spec.seed_block})")


def probe_progress(on_event: EventSink, label: str) -> Callable[[ProbeProgress], None]:
    """A probe's progress as events of the arm `label` (the hot runner's trials too)."""

    def progress(p: ProbeProgress) -> None:
        on_event(ProbeEvent(label, p))
        check_interrupt()  # after each request: a safe point to act on a lost Ctrl-C

    return progress


def collect_on(arm: EngineArm, spec: ProbeSpec, reference: ProbeRun | None,
               api_key: str | None, on_progress: Callable[[ProbeProgress], None],
               prepare: Callable[[], object] = lambda: None,
               replicas: Sequence[str] = (), skip: frozenset[str] = frozenset()) -> ProbeRun:
    """One probe collect on `arm`'s engine; `prepare` runs first, inside the arm's probe (the
    hot runner's switch: a crash there is the probe's crash). `replicas`: urls of other
    engines in the same configuration the probe is sharded across (`collect_sharded`);
    `skip`: case ids an earlier look already probed (`collect`)."""

    def work(url: str) -> ProbeRun:
        prepare()
        if replicas:
            return collect_sharded([url, *replicas], spec, reference_run=reference,
                                   api_key=api_key, model=arm.cfg.served_model_name,
                                   on_progress=on_progress, skip=skip)
        return collect(url, spec, reference_run=reference, api_key=api_key,
                       model=arm.cfg.served_model_name, on_progress=on_progress, skip=skip)

    return arm.probe(work)


def guard(spec: ProbeSpec, arm: EngineArm, work: Callable[[], T], *, good_end: bool,
          crash_note: str | None = None, lost: Callable[[], object] = lambda: None,
          broken: tuple[type[Dsv4BisectError], ...] = (EngineError,),
          engine_tail: bool = False) -> T:
    """Map what can go wrong with one arm to the trial's verdict (`Stop`, run.crash's verdicts).

    A good end that crashed on every attempt is CANNOT_TEST. A candidate's crash is re-raised
    for the caller to word (`Trial._candidate`: whether the good end's baseline was cached or
    relaunched), or is FAIL `crash` at once with `crash_note`. An infrastructure error is
    CANNOT_TEST: an error of `broken`, the engine's (an `EngineError`: busy port, health
    timeout, its message holding the log tail, else `engine_tail` adds it; for the hot runner
    also a `PatchError`: a switch that did not take), or a `ProbeError` (the engine is alive,
    the probe cannot use it) with the log tail. `lost` runs when the engine crashed or cannot
    serve (not on a ProbeError: it keeps serving): the hot runner's engines outlive the trial
    and leave its pool then."""
    try:
        return work()
    except ArmCrashed as exc:
        lost()
        if good_end:
            raise Stop(good_end_crash_verdict(spec, exc.crashes)) from None
        if crash_note is None:
            raise
        raise Stop(crash_verdict(spec, exc.crashes, crash_note)) from None
    except broken as exc:
        lost()
        error, (tail, path) = exc, arm.log_tail() if engine_tail else ("", None)
    except ProbeError as exc:  # `broken` names none of its kind
        error, (tail, path) = exc, arm.log_tail()
    raise Stop(cannot_test_verdict(spec, "good end" if good_end else "candidate", error.message,
                                   tail, path, error.hint)) from None
