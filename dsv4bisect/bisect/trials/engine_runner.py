"""The engine+probe runner: the `Runner` of docs/bisect.md on top of `dsv4bisect run`'s trial.

One trial is the configuration "good end + these patches" (`question.patch_overrides`) launched
on its own engine and judged against the good end's baseline for the seed block (run/trial.py).
The baseline (the good end probed once plus its A/A repeat) lives in the baseline cache, so the
good end is probed once per seed block, whatever the number of trials.

Crashes: run/trial.py already relaunches a crashed engine once; a candidate that crashes again
is FAIL `crash` there, and the runner reports it as such (a definitive FAIL, so the driver does
not launch it twice more). A good end that crashes twice is CANNOT_TEST `crash` (the driver
retries once, then skips: the good end must be testable).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dsv4bisect.bisect.question import base_sets, patch_overrides
from dsv4bisect.bisect.trials.ends_book import FromRun, RunCache, Settled
from dsv4bisect.bisect.trials.reproduce import ReproduceLine, trial_line
from dsv4bisect.bisect.trials.runner import CRASH, TrialResult, TrialRunner
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.resolve import resolve
from dsv4bisect.engines.rundir import new_run_dir, save_config
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.run import session
from dsv4bisect.run.arm import Supervisor
from dsv4bisect.run.ends import Ends, probe_spec
from dsv4bisect.run.events import EventSink, ignore
from dsv4bisect.run.record import RunRecord
from dsv4bisect.run.trial import Trial


class EngineRunner(TrialRunner):
    """Launch each configuration on its own engine and judge it against the good end."""

    def __init__(self, profile: str, good: Mapping[str, str], *, sets: Sequence[str] = (),
                 tier: str | None = None, use_cache: bool = True,
                 good_config: str | None = None, on_event: EventSink = ignore) -> None:
        self.profile, self.sets, self.tier = profile, base_sets(sets), tier
        self.good_config = good_config  # the bisect's --good-config: its Reproduce lines' too
        self.use_cache, self.on_event = use_cache, on_event
        self._lock = threading.Lock()
        self._configs: dict[tuple[tuple[str, str], ...], EngineConfig] = {}
        self._active: set[Supervisor] = set()
        self.good = dict(good)
        self.good_cfg = self.config(self.good)
        if self.good_cfg.cannot_start:
            raise ConfigError(f"the good end cannot start: {self.good_cfg.cannot_start}",
                              "keep the required patch on at the good end")
        self.good_overrides = patch_overrides(self.good, self.sets)
        self.spec = probe_spec(self.good_cfg, tier)
        self.api_key = session.api_key_of(self.good_cfg)

    # -- the Runner protocol ------------------------------------------------------------------
    @property
    def probe_hash(self) -> str:
        """The probe spec and the good end it judges against: a verdict means both."""
        text = json.dumps({"runner": "engine", "spec": self.spec.spec_hash(),
                           "good": self.good_cfg.fingerprint}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def fingerprint(self, patches: Mapping[str, str]) -> str:
        return self.config(patches).fingerprint

    def run(self, patches: dict[str, str], seed_block: int, trial_dir: Path,
            replicas: Sequence[str] = ()) -> TrialResult:
        """One fresh launch of `patches`, judged against the good end (`replicas`: other
        nodes' engines a hot runner would split its probe across; a fresh launch probes its
        own engine)."""
        t0 = time.perf_counter()
        cfg = self.config(patches)
        if cfg.cannot_start:
            raise ConfigError(f"configuration {patches} cannot start: {cfg.cannot_start}",
                              "keep required patches at their good-end state")
        spec = self.spec.replace(seed_block=seed_block)
        run_dir = new_run_dir(trial_dir, cfg.profile, cfg.fingerprint)
        save_config(run_dir / "baseline", self.good_cfg)
        save_config(run_dir / "candidate", cfg)
        line = self.reproduce_line(patches, seed_block)
        record = RunRecord.begin(
            run_dir, command=list(line.argv), profile=self.profile,
            overrides=patch_overrides(patches, self.sets), good_overrides=self.good_overrides,
            use_cache=self.use_cache, spec=spec, good=self.good_cfg, candidate=cfg)
        supervisor = Supervisor()
        with self._lock:
            self._active.add(supervisor)
        trial = Trial(Ends(self.good_cfg, cfg, self.good_overrides), spec, run_dir, record,
                      supervisor, self.on_event, self.api_key, self.use_cache)
        try:
            verdict = session.judge_trial(trial, record)
        finally:
            with self._lock:
                self._active.discard(supervisor)
        verdict = session.finish(run_dir, record, trial, verdict)
        return trial_result(verdict, trial, run_dir, time.perf_counter() - t0, line.text())

    # -- helpers ------------------------------------------------------------------------------
    def config(self, patches: Mapping[str, str]) -> EngineConfig:
        key = tuple(sorted(patches.items()))
        with self._lock:
            if key not in self._configs:
                self._configs[key] = resolve(self.profile, patch_overrides(patches, self.sets))
            return self._configs[key]

    def stop_all(self) -> None:
        """Stop the engines of every trial in flight (Ctrl-C with parallel trials)."""
        with self._lock:
            active = list(self._active)
        for supervisor in active:
            supervisor.stop_all()

    # -- what a node's runner does for the Ray executor (hot_runner.py overrides each) -------
    def ahead(self, patches: dict[str, str], seed_block: int, trial_dir: Path,
              replicas: Sequence[str] = ()) -> int:
        """A probe started ahead of the good end's run: a hot runner's (it shares its ends)."""
        raise ConfigError("a probe started ahead needs a hot runner", "drop --fresh-launches")

    def replica(self, patches: dict[str, str], trial_dir: Path) -> str:
        """An engine kept up for another node's probe: a hot runner's."""
        raise ConfigError("a replica needs a hot runner", "drop --fresh-launches")

    def engine_key(self, patches: Mapping[str, str]) -> str | None:
        """The engine kept up that a trial of `patches` runs in; None: a fresh launch."""
        return None

    @property
    def engines_up(self) -> tuple[str, ...]:
        """The engines kept up after a trial (`engine_key`): none for fresh launches."""
        return ()

    @staticmethod
    def ends_dir(trial_dir: Path) -> Path | None:
        """Where the ends other nodes may adopt are kept; None: each trial measures its own."""
        return None

    def adopt_ends(self, block: int, base: ProbeRun | None, repeat: ProbeRun | None,
                   bad: ProbeRun | None, *, good_fingerprint: str, source: str,
                   look: int | None = None, settled: Settled | None = None,
                   from_run: FromRun | None = None) -> list[str]:
        """Fresh launches judge each trial against its own ends: nothing to adopt."""
        return []

    def run_cache(self) -> RunCache | None:
        """The ends a failing `run` cached for seed block 0 (hot runners install them):
        fresh launches measure their own."""
        return None

    def run_argv(self, patches: Mapping[str, str], seed_block: int = 0) -> list[str]:
        """`dsv4bisect run` for this patch set against the trial's own good end (the good end
        itself is `--only none`: an empty `--only` is refused)."""
        return list(self.reproduce_line(patches, seed_block).argv)

    def reproduce(self, patches: Mapping[str, str], seed_block: int = 0) -> str:
        """The `dsv4bisect run` command that asks the same question (notes where it cannot)."""
        return self.reproduce_line(patches, seed_block).text()

    def reproduce_line(self, patches: Mapping[str, str], seed_block: int = 0) -> ReproduceLine:
        return trial_line(self.profile, patches, self.sets, tier=self.spec.tier,
                          seed_block=seed_block, good_config=self.good_config,
                          good=self.good_cfg, candidate=self.config(patches))


def signature_of(verdict: V.Verdict) -> str | None:
    """A short name for why a trial did not pass: crash, drift, a hard signature, accuracy."""
    if verdict.signatures.get("crash"):
        return CRASH
    if verdict.verdict == V.PASS:
        return None
    if verdict.verdict == V.CANNOT_TEST:
        return "infrastructure"
    if verdict.verdict == V.BETWEEN:
        return "between"
    decided = verdict.decided_by
    if decided in ("drift", "accuracy"):  # a sequential trial says what decided it
        return decided
    hard = verdict.signatures.get("candidate") or {}
    if verdict.signatures.get("hard_fail") and hard:
        return str(next(iter(hard)))
    if decided == "signatures":
        return "signatures"
    # drift never FAILs on its own (probe/judge.py): a FAIL is facts lost, a WARN is drift
    if verdict.verdict == V.FAIL or verdict.drift.get("status") not in ("fail", "warn"):
        return "accuracy"
    return "drift"


def trial_result(verdict: V.Verdict, trial: Trial, run_dir: Path, duration_s: float,
                 command: str) -> TrialResult:
    """The bisect's view of one `run`: verdict, signature, scores, the A/A made on the way."""
    cached = trial.record.arm("baseline")["cached"] is not None
    aa: tuple[str, ...] = ()
    if not cached and trial.base is not None and trial.repeat is not None:
        try:
            aa = (aa_verdict(trial.base, trial.repeat).verdict,)
        except ConfigError:  # the two runs cannot be paired: no A/A evidence from this trial
            aa = ()
    details = result_details(verdict, ends_cached=cached, run_dir=run_dir,
                             command=command)
    details["mode"] = "fresh"
    runs = [trial.cand] + ([] if cached else [trial.base, trial.repeat])
    requests = sum(len(r.rows) for r in runs if r is not None)
    return TrialResult(verdict=verdict.verdict, signature=signature_of(verdict),
                       duration_s=duration_s, details=details, throughput=throughput(trial.cand),
                       log_path=_log_path(run_dir), aa_verdicts=aa, requests=requests)


def result_details(verdict: V.Verdict, *, ends_cached: bool, run_dir: Path,
                   command: str) -> dict[str, Any]:
    """The JSON evidence of one trial's verdict, as the ledger and the report keep it."""
    drift = verdict.drift
    trigger = drift.get("trigger") or {}
    return {
        "verdict": verdict.verdict,
        "reasons": list(verdict.reasons[:4]),
        "families": {f: {"baseline_accuracy": r.baseline_accuracy,
                         "candidate_accuracy": r.candidate_accuracy, "lost": r.b,
                         "gained": r.c, "p_value": r.p_value, "evidence": r.evidence}
                     for f, r in verdict.families.items()},
        "drift": {"status": drift.get("status"), "where": trigger.get("where"),
                  "kl_mean": trigger.get("kl_mean"),
                  "top1_agreement": trigger.get("top1_agreement"),
                  "kl_by_view": view_kls(drift)},
        "aa": dict(verdict.aa),
        "baseline_cached": ends_cached,
        "run_dir": str(run_dir),
        "command": command,
    }


def view_kls(drift: dict[str, Any]) -> dict[str, float]:
    """The mean KL of every drift view (all positions, the answer positions, each position
    bucket): a full verdict's `views`, a sequential trial's figures' (so that a report compares
    two trials in one view: the bad end's)."""
    trigger = drift.get("trigger") or {}
    views = drift.get("views") or trigger.get("views") or {}
    out = {}
    for where, v in views.items():
        kl = v.get("kl_mean") if isinstance(v, dict) else v[0] if v else None
        if isinstance(kl, (int, float)):
            out[str(where)] = float(kl)
    return out


def aa_verdict(base: ProbeRun, repeat: ProbeRun) -> V.Verdict:
    """The good end judged against itself (its repeat as the candidate, no floor)."""
    from dsv4bisect.probe.judge import decide

    return decide(base, None, repeat)


def throughput(run: ProbeRun | None) -> float | None:
    """Tokens per second of a probe run (prompt and completion), if it was timed."""
    if run is None or not run.timing.get("total_s"):
        return None
    tokens = sum(int(r.get("prompt_tokens") or 0) + int(r.get("completion_tokens") or 0)
                 for r in run.rows)
    return round(tokens / float(run.timing["total_s"]), 1)


def _log_path(run_dir: Path) -> str | None:
    logs = sorted((run_dir / "candidate" / "logs").glob("*.log"))
    return str(logs[0]) if logs else None
