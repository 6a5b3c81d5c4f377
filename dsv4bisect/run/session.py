"""`dsv4bisect run`: resolve both ends, launch, probe, judge, write the run directory.

The loop (docs/run.md):
1. Resolve the candidate and its good end (`ends.py`); one that cannot start is exit 5.
2. Baseline = the good end probed once plus an A/A repeat, reused from the cache when the same
   (fingerprint, spec hash, seed block) was measured before (unless `--no-cache`).
3. The candidate is always launched as its own engine, even when its fingerprint equals the
   good end's, and probed with the baseline's exact requests (`trial.py` schedules the engines).
4. Judge, render the heatmap, write verdict.json, report.md and run.json.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.resolve import DEFAULT_PROFILE, Overrides
from dsv4bisect.engines.rundir import ensure_runs_root, new_run_dir, save_config
from dsv4bisect.errors import ConfigError, Dsv4BisectError, ExitCode
from dsv4bisect.probe.session import write_verdict
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.run.arm import Cancelled, Supervisor
from dsv4bisect.run.ends import probe_spec, resolve_ends
from dsv4bisect.run.events import EventSink, Notice, ignore
from dsv4bisect.run.orphans import clean_predecessors
from dsv4bisect.run.record import RunRecord
from dsv4bisect.run.signals import shielded
from dsv4bisect.run.trial import Trial
from dsv4bisect.base.storage import storage_failure

@dataclass(frozen=True)
class RunRequest:
    profile: str = DEFAULT_PROFILE
    overrides: Overrides = field(default_factory=Overrides)
    tier: str | None = None  # None: the profile's probe.tier
    seed_block: int | None = None  # a deliberate re-test draws a fresh block (the bisect does)
    runs_root: Path = Path("runs")
    use_cache: bool = True
    command: tuple[str, ...] = ()  # argv as typed, for run.json
    # how the command exits (run.json `exit`, so report.md says the exit the process had):
    # a drift WARN's code (probe.verdict.exit_code_as) and the exit policy (errors.policy_exit)
    warn_exit: str = "pass"  # --warn-as; run.json keeps it as `warn_as`
    exit_policy: str = "default"
    good_config: str | None = None  # the good end as given (else the profile's: run/ends.py)


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    verdict: Verdict

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


def run(request: RunRequest, on_event: EventSink = ignore) -> RunOutcome:
    """The whole loop; a `Verdict` for every outcome of the trial. Bad input raises (exit 5),
    Ctrl-C/SIGTERM raise KeyboardInterrupt after every engine is stopped (exit 130)."""
    ends = resolve_ends(request.profile, request.overrides, request.good_config)
    spec = probe_spec(ends.candidate, request.tier)
    if request.seed_block is not None:
        spec = spec.replace(seed_block=request.seed_block)
    api_key = api_key_of(ends.candidate)
    ensure_runs_root(request.runs_root)
    for sentence in clean_predecessors(request.runs_root):  # what a kill -9 left behind
        on_event(Notice(sentence, "warn"))
    run_dir = new_run_dir(request.runs_root, ends.candidate.profile, ends.candidate.fingerprint)
    save_config(run_dir / "baseline", ends.good)
    save_config(run_dir / "candidate", ends.candidate)
    record = RunRecord.begin(
        run_dir, command=list(request.command), profile=request.profile,
        overrides=request.overrides, good_overrides=ends.good_overrides,
        use_cache=request.use_cache, spec=spec, good=ends.good, candidate=ends.candidate,
        good_config=request.good_config)
    record.set("exit", {"warn_as": request.warn_exit, "policy": request.exit_policy})
    on_event(Notice(f"run directory: {run_dir}", run_dir=str(run_dir)))
    trial = Trial(ends, spec, run_dir, record, Supervisor(), on_event, api_key, request.use_cache,
                  cache_candidate=True)
    return RunOutcome(run_dir, finish(run_dir, record, trial, judge_trial(trial, record)))


def judge_trial(trial: Trial, record: RunRecord) -> Verdict:
    """`trial.run()`, then every engine stopped however it ends (the bisect's runner uses it
    too). Ctrl-C/SIGTERM re-raise KeyboardInterrupt once the run record says `interrupted`."""
    try:
        verdict = trial.run()
    except (KeyboardInterrupt, Cancelled):
        _abort(trial, record, "interrupted", int(ExitCode.INTERRUPTED))
        raise KeyboardInterrupt() from None
    except Dsv4BisectError as exc:
        _abort(trial, record, "error", int(exc.exit_code), (exc.message, exc.hint))
        raise
    except BaseException as exc:
        storage = storage_failure(exc)
        if storage is not None:  # disk full / permission lost: infrastructure (exit 125)
            _abort(trial, record, "error", int(storage.exit_code),
                   (storage.message, storage.hint))
            raise storage from exc
        _abort(trial, record, "error", int(ExitCode.INTERNAL), ("internal error", None))
        raise
    with shielded():
        trial.stop()
    return verdict


def _abort(trial: Trial, record: RunRecord, status: str, code: int,
           error: tuple[str, str | None] | None = None) -> None:
    """Stop every engine (a second Ctrl-C cannot cut this short) and say how the run ended."""
    with shielded():
        trial.stop()
        try:
            record.finish(status, exit_code=code, error=error)
        except OSError:
            pass  # the disk that failed the run cannot take its record either: the next run
            # on this runs root finds it `running` with its driver gone and marks it abandoned


def api_key_of(cfg: EngineConfig) -> str | None:
    if not cfg.api_key_env:
        return None
    key = os.environ.get(cfg.api_key_env)
    if not key:
        raise ConfigError(f"the profile names engine.api_key_env `{cfg.api_key_env}`, which is "
                          "not set", f"export {cfg.api_key_env}=<key>")
    return key


def finish(run_dir: Path, record: RunRecord, trial: Trial, verdict: Verdict) -> Verdict:
    """Heatmap, verdict.json (with its evidence paths), run.json, report.md. A full disk on
    the way ends the record `error` (its reserve takes it) and is a StorageError (exit 125)."""
    try:
        return _finish(run_dir, record, trial, verdict)
    except Exception as exc:
        storage = storage_failure(exc)
        if storage is None:
            raise
        with contextlib.suppress(OSError):
            record.finish("error", exit_code=int(storage.exit_code),
                          error=(storage.message, storage.hint))
        raise storage from exc


def _finish(run_dir: Path, record: RunRecord, trial: Trial, verdict: Verdict) -> Verdict:
    from dsv4bisect.report.heatmap import PLOTS_SKIPPED, render_heatmap
    from dsv4bisect.report.run_report import load_run, render_markdown

    t0 = time.perf_counter()
    runs = {"baseline": trial.base, "baseline_repeat": trial.repeat, "candidate": trial.cand}
    verdict = verdict.with_evidence(**{k: r.path if r else None for k, r in runs.items()})
    png = None
    if trial.base is not None and trial.cand is not None:
        png = render_heatmap(trial.base.rows, trial.cand.rows, run_dir / "heatmap.png",
                             title=f"{verdict.verdict}: {record.doc['profile']}",
                             verdict=verdict.to_dict())
        if png is None:
            record.note(PLOTS_SKIPPED)
    verdict = verdict.with_evidence(heatmap=str(png) if png else None)
    write_verdict(run_dir, verdict)
    record.time("report_s", time.perf_counter() - t0)
    record.finish("done", verdict=verdict.verdict, exit_code=verdict.exit_code)
    (run_dir / "report.md").write_text(render_markdown(load_run(run_dir)))
    return verdict
