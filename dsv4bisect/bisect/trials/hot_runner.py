"""The hot runner: one engine kept up across trials, patches switched inside it.

A trial of configuration C runs in the engine of C's load-time state λ(C) (the candidates whose
effect is fixed at load, `Question.load_time`). When no engine of λ(C) is up, one is launched in
C itself (hot environment on, so it can be switched later): that trial is then a fresh launch's,
and its result says so (`fresh_launch`), which can stand as the fresh confirmation of a culprit
set (driver.py). Later trials of the same λ are switched in that engine by the protocol of
base/switching.py (drain, request, `/flush_cache`, a receipt from every process naming the
generation, verified before any probe request).
Engines kept up at once: `pool` (the embedded engine: 2; one SGLang node: 1; the least
recently used is stopped first): `hot_engines.EnginePool`. A seed block's ends are one
`shared_ends.BlockEnds`; what one trial did (its spec, costs, the engine it probed in, the ends it
measured) is its `_TrialContext`, never the runner's state. What goes wrong with an engine
becomes the trial's verdict by run/trial.py's `guard`, and a probe collects by its `collect_on`
(this runner's differences are their parameters).

What each trial probes (docs/hot-switching.md):
- the good end's baseline (full size) and its A/A repeat are measured right after the launch
  of the good end, before any switch, so they are a fresh launch's (and are cached as such; the
  baseline of a later seed block, measured in a switched engine, is not cached); the ∅ end
  check's verdict is then the A/A verdict (the repeat judged against the baseline);
- the bad end is probed at full size;
- any other configuration gets the sequential trial probe (probe/sequential_run.py) against the
  two ends once both are measured for the seed block, else a full probe.
Ends measured on another machine of the same bisect (the Ray executor's other nodes) are
installed with `adopt_ends` before a trial: checked against this runner's probe spec, seed block
and good end, they serve as if measured here, so this runner measures no good end another one
measured, and probes sequentially once any node ran the bad end. Their A/A verdict is the
measuring node's (already reported by its trial): a ∅ end check of an adopted seed block has
that verdict, launches nothing and reports no A/A verdict again. A trial's details name the ends
it measured (`ends_measured`: `b<block>/<end>`, under `ends_dir`) and those it used from another
node (`ends_from`: end -> node).
A hot trial's ledger fingerprint is the fresh fingerprint of C plus the hot marker and the
canonical base of λ(C) (the good end with λ's candidates at the bad end: `fingerprint`; the
configuration an engine was really launched in is in the trial's details, `launched_as`);
`confirm` is a fresh launch of C with no hot environment (its plain fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dsv4bisect import env as envvars
from dsv4bisect.base import switching
from dsv4bisect.bisect.setting_candidates import is_setting
from dsv4bisect.bisect.trials.engine_runner import (
    EngineRunner,
    aa_verdict,
    result_details,
    signature_of,
    throughput,
)
from dsv4bisect.bisect.trials.hot_engines import EnginePool, HotEngine, new_dir, with_env
from dsv4bisect.bisect.trials.runner import FreshLaunch, TrialResult
from dsv4bisect.bisect.trials.shared_ends import BlockEnds, HotEnds, end_name
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.engines.rundir import save_config
from dsv4bisect.engines.verify import server_info, verify_reference_patches
from dsv4bisect.errors import ConfigError, Dsv4BisectError, EngineError, PatchError
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patching.wire import format_patch_set
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.client import ProbeClient
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import judge
from dsv4bisect.probe.sequential import TRIAL_ERROR_RATES
from dsv4bisect.probe.session import write_verdict
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.run import baseline as cache
from dsv4bisect.run.arm import EngineArm, Supervisor
from dsv4bisect.run.events import EventSink, Notice, ignore
from dsv4bisect.run.trial import Stop, collect_on, guard, probe_progress

T = TypeVar("T")
HOT_MARKER = "hot-v1"
SEQUENTIAL_RULES = 2  # bump when probe/sequential.py decides differently: no reuse of old verdicts
SWITCH_TIMEOUT_S = 600.0  # a CUDA-graph re-capture of an 8-GPU engine takes minutes


_Probed = tuple[V.Verdict, "ProbeRun | None", "int | None"]  # verdict, its run, its requests


@dataclass
class _TrialContext:
    """One trial's own state: the spec a verdict that stops it records (its seed block), the
    seconds it spent launching, switching and probing, the engine it probed in and the ends it
    measured (`b<block>/<end>`)."""

    spec: ProbeSpec
    costs: dict[str, float] = field(
        default_factory=lambda: {"launch_s": 0.0, "switch_s": 0.0, "probe_s": 0.0})
    probed_in: HotEngine | None = None
    measured: list[str] = field(default_factory=list)
    replicas: tuple[str, ...] = ()  # urls of other nodes' engines in `patches`
    patches: dict[str, str] = field(default_factory=dict)  # the trial's configuration
    sharded: bool = False  # whether the probe really ran across them (else on this engine)


class HotEngineRunner(EngineRunner):
    """`EngineRunner` with hot switching (see the module docstring). `good`, `bad`: the patch
    sets of the two ends as the search names them (`BisectSpec.patches_for`)."""

    hot = True

    def __init__(self, profile: str, good: Mapping[str, str], bad: Mapping[str, str], *,
                 load_time: Sequence[str] = (), sets: Sequence[str] = (),
                 tier: str | None = None, use_cache: bool = True, pool: int | None = None,
                 sequential: bool = True,
                 error_rates: tuple[float, float] = TRIAL_ERROR_RATES, warn_as: str = "fail",
                 drift: str = "absolute", on_event: EventSink = ignore) -> None:
        super().__init__(profile, good, sets=sets, tier=tier, use_cache=use_cache,
                         on_event=on_event)
        self.bad = dict(bad)
        self.load_time = frozenset(load_time)
        self.pool = pool if pool is not None else (2 if self.good_cfg.kind == "reference" else 1)
        self.sequential, self.error_rates = sequential, error_rates
        self.warn_fails = warn_as != "pass"  # how the search counts a WARN (--warn-as)
        if drift not in ("absolute", "relative"):
            raise ConfigError(f"drift is `{drift}`", "use `absolute` or `relative`")
        self.drift_relative = drift == "relative"  # --drift (probe/sequential.py)
        hot = {n: v for n, v in self.bad.items() if n not in self.load_time
               and self.good.get(n) != v}
        self.hot_wire = format_patch_set(hot, builtin_patches())
        self._pool = EnginePool(self.pool)
        self._supervisor = Supervisor()
        self._ends = HotEnds()
        self.launches = 0  # engines this runner launched (a crash relaunch counts once more)
        self._run_lock = threading.Lock()  # one trial at a time: one engine pool, one node
        # a candidate's probe started before the good end's run existed (`ahead`): per
        # (configuration, seed block), the shards' accuracy parts and the seconds they took
        self._ahead: dict[tuple[str, int], tuple[list[ProbeRun], dict[str, float]]] = {}

    # -- identity ------------------------------------------------------------------------------
    @property
    def probe_hash(self) -> str:
        """The engine runner's, plus the rules a sequential trial is judged by (its error
        rates, how it counts a drift WARN, how it judges drift): a verdict means those too.
        Drift judged against the two ends means the bad end as well: the same trial in a bisect
        with another bad end is another measurement, never reused from the ledger."""
        rules = {"engine": super().probe_hash, "rules": SEQUENTIAL_RULES,
                 "sequential": self.sequential,
                 "error_rates": list(self.error_rates), "warn_fails": self.warn_fails,
                 "drift_relative": self.drift_relative,
                 "bad": self.config(self.bad).fingerprint if self.drift_relative else None}
        return hashlib.sha256(json.dumps(rules, sort_keys=True).encode()).hexdigest()[:32]

    def base_of(self, patches: Mapping[str, str]) -> dict[str, str]:
        """The canonical base of `patches`' load-time state: its load-time part, the good end
        elsewhere (it names the engine and the hot fingerprint; an engine is launched in its
        first trial's own set)."""
        return {**{n: v for n, v in self.good.items() if n not in self.load_time},
                **{n: v for n, v in patches.items() if n in self.load_time}}

    def engine_key(self, patches: Mapping[str, str]) -> str:
        """The engine a trial of `patches` runs in: its load-time state, named by the
        fingerprint of that state's canonical base (one engine per state)."""
        return self.config(self.base_of(patches)).fingerprint

    def fingerprint(self, patches: Mapping[str, str]) -> str:
        text = json.dumps([super().fingerprint(patches), HOT_MARKER, self.engine_key(patches)])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def fresh(self) -> FreshLaunch:
        """The confirmation, keyed by the configuration's fresh fingerprint (`EngineRunner`'s)."""
        return FreshLaunch(super().fingerprint, self.confirm)

    # -- trials --------------------------------------------------------------------------------
    def run(self, patches: dict[str, str], seed_block: int, trial_dir: Path,
            replicas: Sequence[str] = ()) -> TrialResult:
        """One hot trial. `replicas`: urls of engines on other nodes already switched to
        `patches` (`replica`); the trial's probes of `patches` (a full-size one: an end's,
        the good end's baseline and A/A repeat; or a sequential one) are split across them and
        this engine (probe/shards.py), merged into, or observed in the order of, one node's."""
        with self._run_lock:
            return self._trial(patches, seed_block, trial_dir, fresh=False,
                               replicas=tuple(replicas))

    def ahead(self, patches: dict[str, str], seed_block: int, trial_dir: Path,
              replicas: Sequence[str] = ()) -> int:
        """The accuracy part of `patches`' full-size probe at `seed_block`, before the good
        end's run exists (probe/ahead.py): its engine up and switched, its accuracy requests
        sent (split across `replicas` as `run` splits the probe), kept for the next `run` of
        the same trial, which scores the drift part once it has the good end's run. Returns
        the rows sent; 0 where it could not (an engine that cannot serve, a lost replica: the
        trial then probes from the start, as without it)."""
        from dsv4bisect.probe.ahead import collect_ahead, collect_ahead_sharded

        with self._run_lock:
            spec = self.spec.replace(seed_block=seed_block)
            ctx = _TrialContext(spec, replicas=tuple(replicas), patches=dict(patches))
            key = (self.fingerprint(patches), seed_block)
            self._ahead.pop(key, None)
            def work(url: str) -> list[ProbeRun]:
                model = eng.cfg.served_model_name
                self._switch(ctx, eng, patches)
                if replicas:
                    return collect_ahead_sharded([url, *replicas], spec, api_key=self.api_key,
                                                 model=model)
                return [collect_ahead(url, spec, api_key=self.api_key, model=model)]

            try:
                eng = self._engine_for(ctx, patches, trial_dir)
                runs = self._timed(ctx, eng, patches, lambda: eng.arm.probe(work),
                                   good_end=False)
            except (Stop, Dsv4BisectError, OSError) as exc:
                self.on_event(Notice(f"the probe of {sorted(patches)} could not start ahead of "
                                     f"the good end ({exc}): it runs whole", "warn"))
                return 0
            self._ahead[key] = (runs, dict(ctx.costs))
            return sum(len(r.rows) for r in runs)

    def replica(self, patches: dict[str, str], trial_dir: Path) -> str:
        """Bring the engine of λ(`patches`) up and switch it to `patches` (receipts verified,
        as before any probe here), for another node's trial to send part of its probe to;
        returns its url. Raises `Stop` when the engine cannot serve."""
        with self._run_lock:
            ctx = _TrialContext(self.spec)
            eng = self._engine_for(ctx, patches, trial_dir)

            def ready() -> None:
                eng.arm.ready()
                self._switch(ctx, eng, patches)

            self._guard(ctx, eng, ready, good_end=False)
            assert eng.arm.launch is not None
            return str(eng.arm.launch.url)

    def confirm(self, patches: dict[str, str], seed_block: int, trial_dir: Path) -> TrialResult:
        """A fresh launch of `patches` (no hot environment), judged like a hot trial."""
        with self._run_lock:
            return self._trial(patches, seed_block, trial_dir, fresh=True)

    def stop_all(self) -> None:
        self._supervisor.stop_all()
        super().stop_all()

    def close(self) -> None:
        """Stop every engine this runner keeps up (the bisect is over)."""
        self._pool.close()

    # -- ends measured elsewhere ---------------------------------------------------------------
    @staticmethod
    def ends_dir(trial_dir: Path) -> Path:
        """Where the trials of `trial_dir`'s bisect keep the ends (`b<block>/<end>`)."""
        return trial_dir.parent.parent / "ends"

    @property
    def engines_up(self) -> tuple[str, ...]:
        """The load-time states whose engine is up (`engine_key`)."""
        return tuple(self._pool.slots.up)

    def adopt_ends(self, block: int, base: ProbeRun | None, repeat: ProbeRun | None,
                   bad: ProbeRun | None, *, good_fingerprint: str, source: str) -> list[str]:
        """Install ends of seed block `block` measured by `source` (another node of this
        bisect) for the next trials (`HotEnds.adopt`); returns the ends installed."""
        return self._ends.adopt(block, base, repeat, bad, spec=self.spec,
                                good=self.good_cfg.fingerprint,
                                good_fingerprint=good_fingerprint, source=source)

    def _trial(self, patches: dict[str, str], block: int, trial_dir: Path, fresh: bool,
               replicas: tuple[str, ...] = ()) -> TrialResult:
        t0 = time.perf_counter()
        cfg = self.config(patches)
        if cfg.cannot_start:
            raise ConfigError(f"configuration {patches} cannot start: {cfg.cannot_start}",
                              "keep required patches at their good-end state")
        # A sequential trial's re-test (block > 0) draws other requests, in another order,
        # against the first block's ends; an end's re-test probes its own block at full size.
        first = self._ends.known(0)
        reuse = (self.sequential and patches not in (self.good, self.bad)
                 and first is not None and first.bad is not None)
        ctx = _TrialContext(self.spec.replace(seed_block=0 if reuse else block),
                            replicas=replicas, patches=dict(patches))
        save_config(trial_dir / "candidate", cfg)
        measured_base = False
        eng: HotEngine | None = None  # the confirmation's own engine
        try:
            ends, measured_base = self._ends_for(ctx, trial_dir)
            if fresh:  # the confirmation: exactly `patches`, no hot environment
                eng = self._launch(ctx, "fresh", patches, cfg, trial_dir / "engine")
            verdict, cand, requests = self._probe(ctx, patches, ends, measured_base, eng,
                                                  trial_dir, draw=block)
            if measured_base:  # this trial also measured the good end and its A/A repeat
                requests = (requests or 0) + sum(len(r.rows) for r in (ends.baseline,
                                                                       ends.repeat) if r)
        except Stop as stop:
            verdict, cand, requests = stop.verdict, None, None
        finally:
            if eng is not None:
                eng.arm.stop()
        verdict = verdict.with_evidence(candidate=cand.path if cand else None)
        write_verdict(trial_dir, verdict)
        used = ctx.probed_in
        came_from = self._ends.blocks.get(ctx.spec.seed_block, BlockEnds()).came_from
        details = result_details(verdict, ends_cached=not measured_base,
                                 run_dir=trial_dir, command=self.reproduce(patches, block))
        details.update(mode="fresh" if fresh else "hot", requests=requests,
                       base=self.base_of(patches), launched_as=used.base if used else None,
                       fresh_launch=fresh or bool(used and used.fresh_in(patches)),
                       ends_measured=list(ctx.measured),
                       ends_from=dict(sorted(came_from.items())),
                       shards=1 + len(ctx.replicas) if ctx.sharded else 1,
                       **{k: round(v, 3) for k, v in ctx.costs.items()})
        aa = self._ends.take_aa(block)
        return TrialResult(verdict.verdict, signature_of(verdict),
                           time.perf_counter() - t0, details, throughput(cand), None, aa,
                           error_rates=verdict.error_rates, requests=requests)

    # -- the ends ------------------------------------------------------------------------------
    def _ends_for(self, ctx: _TrialContext, trial_dir: Path) -> tuple[BlockEnds, bool]:
        """The good end's baseline and A/A repeat for this seed block (measured now on the
        engine of λ = ∅ if not cached: then `True`), and the bad end's run once measured."""
        block = ctx.spec.seed_block
        ends = self._ends.block(block)
        if ends.known:
            return ends, False
        ends_dir = self.ends_dir(trial_dir) / f"b{block}"
        key = cache.BaselineKey.of(self.good_cfg.fingerprint, ctx.spec)
        hit, why = cache.lookup(key) if self.use_cache else (None, None)
        if why:
            self.on_event(Notice(why, "warn"))
        if hit is not None:
            ends.baseline, ends.repeat = hit.install(ends_dir / "baseline",
                                                     ends_dir / "baseline-repeat")
        else:
            eng = self._engine_for(ctx, self.good, trial_dir)
            ctx.probed_in = eng
            fresh = eng.fresh_in(self.good)  # not an engine launched in another set of λ = ∅
            base = self._collect(ctx, eng, self.good, None, "baseline",
                                 good_end=True).save(ends_dir / "baseline")
            ref, _subset = cache.repeat_reference(base)
            repeat = self._collect(ctx, eng, self.good, ref, "A/A repeat",
                                   good_end=True).save(ends_dir / "baseline-repeat")
            ends.baseline, ends.repeat = base, repeat
            ends.aa = (aa_verdict(base, repeat).verdict,)
            ctx.measured += [end_name(block, "baseline"), end_name(block, "baseline-repeat")]
            if not fresh:  # a re-test's seed block, measured in a switched engine
                self.on_event(Notice(f"baseline of seed block {block} measured in a hot-"
                                     "switched engine: not cached", "warn"))
            elif eng.arm.verified is True:
                try:
                    cache.store(key, ends_dir / "baseline", ends_dir / "baseline-repeat")
                except OSError as exc:
                    self.on_event(Notice(f"baseline not cached: {exc}", "warn"))
        if ends.bad is None and (ends_dir / "bad" / "run.json").exists():
            ends.bad = ProbeRun.load(ends_dir / "bad")
        return ends, hit is None

    # -- probing -------------------------------------------------------------------------------
    def _probe(self, ctx: _TrialContext, patches: dict[str, str], ends: BlockEnds,
               measured_base: bool, fresh_eng: HotEngine | None, trial_dir: Path,
               draw: int) -> _Probed:
        base, repeat, bad = ends.baseline, ends.repeat, ends.bad
        assert base is not None
        block = ctx.spec.seed_block
        if patches == self.good and (measured_base or ends.adopted("baseline")) \
                and fresh_eng is None:
            # The ∅ end check: the good end was just measured twice in a fresh launch (here,
            # or on the node these ends came from, whose trial reported the A/A verdict).
            assert repeat is not None
            return aa_verdict(base, repeat), repeat, 0
        eng = fresh_eng or self._engine_for(ctx, patches, trial_dir)
        ctx.probed_in = eng
        if bad is not None and patches != self.bad and self.sequential:
            return self._sequential(ctx, eng, patches, base, repeat, bad, trial_dir, draw)
        label = "good end (re-test)" if patches == self.good else "candidate"  # live view
        cand = (self._finish_ahead(ctx, eng, patches, base, draw)
                or self._collect(ctx, eng, patches, base, label, good_end=False)
                ).save(trial_dir / "candidate")
        if patches == self.bad:
            cand.save(self.ends_dir(trial_dir) / end_name(block, "bad"))
            if ends.bad is None or not ends.adopted("bad"):
                ends.bad = cand  # an adopted bad end stays: every node judges against it
            ctx.measured.append(end_name(block, "bad"))
        return judge(base, repeat, cand), cand, len(cand.rows)

    def _sequential(self, ctx: _TrialContext, eng: HotEngine, patches: dict[str, str],
                    base: ProbeRun, repeat: ProbeRun | None, bad: ProbeRun, trial_dir: Path,
                    draw: int) -> _Probed:
        from dsv4bisect.probe.sequential_run import run_sequential

        ff, fp = self.error_rates
        # its own draw order per configuration and re-test
        seed = int(hashlib.sha256(f"{self.fingerprint(patches)}:{draw}".encode())
                   .hexdigest()[:8], 16)

        def on(urls: Sequence[str]) -> Any:
            return run_sequential(urls, base, bad, repeat, false_fail=ff, false_pass=fp,
                                  seed=seed, api_key=self.api_key,
                                  model=eng.cfg.served_model_name, warn_fails=self.warn_fails,
                                  drift_relative=self.drift_relative)

        def work(url: str) -> Any:
            self._switch(ctx, eng, patches)
            if ctx.replicas:
                try:  # the same draws and decision as on one node (probe/shards.py)
                    out = on([url, *ctx.replicas])
                    ctx.sharded = True
                    return out
                except (Dsv4BisectError, OSError) as exc:  # a replica's node or engine lost:
                    self.on_event(Notice(f"sharded probe lost a replica ({exc}): probed on "
                                         "this node alone", "warn"))  # the same requests
            return on([url])

        outcome = self._timed(ctx, eng, patches, lambda: eng.arm.probe(work), good_end=False)
        saved = outcome.save(trial_dir / "candidate")
        return saved.as_verdict(), saved.run, saved.decision.requests

    def _finish_ahead(self, ctx: _TrialContext, eng: HotEngine, patches: dict[str, str],
                      base: ProbeRun, block: int) -> ProbeRun | None:
        """The probe `ahead` started, finished against the good end's run `base` (its drift
        transcripts scored on the engines that ran each shard); None where none was started,
        or its cases are not the good end's (the probe then runs whole)."""
        from dsv4bisect.probe.ahead import OtherCases, finish_ahead, finish_ahead_sharded

        started = self._ahead.pop((self.fingerprint(patches), block), None)
        if started is None:
            return None
        runs, costs = started
        for name, seconds in costs.items():  # the trial's costs count its ahead part
            ctx.costs[name] += seconds
        model = eng.cfg.served_model_name

        def work(url: str) -> ProbeRun:
            self._switch(ctx, eng, patches)
            if len(runs) == 1:
                return finish_ahead(url, runs[0], base, api_key=self.api_key, model=model)
            # each shard where it ran; one whose replica is gone, here
            return finish_ahead_sharded([url], runs, base, api_key=self.api_key, model=model)

        try:
            run = self._timed(ctx, eng, patches, lambda: eng.arm.probe(work), good_end=False)
        except OtherCases as exc:
            self.on_event(Notice(f"{exc.message}: the candidate probes them again", "warn"))
            return None
        ctx.sharded = ctx.sharded or len(runs) > 1
        return run

    def _collect(self, ctx: _TrialContext, eng: HotEngine, patches: Mapping[str, str],
                 reference: ProbeRun | None, label: str, *, good_end: bool) -> ProbeRun:
        progress = probe_progress(self.on_event, label)
        replicas = ctx.replicas if dict(patches) == ctx.patches else ()  # in this configuration
        run = self._timed(ctx, eng, patches, lambda: collect_on(
            eng.arm, ctx.spec, reference, self.api_key, progress,
            lambda: self._switch(ctx, eng, patches), replicas), good_end=good_end)
        ctx.sharded = ctx.sharded or bool(replicas)
        return run

    def _timed(self, ctx: _TrialContext, eng: HotEngine, patches: Mapping[str, str],
               probe: Callable[[], T], *, good_end: bool) -> T:
        """`probe` (which switches `eng` to `patches` again inside the arm's probe: a crash
        relaunch starts from the base), guarded; the engine is up and switched to `patches`
        before its clock starts."""
        def ready() -> None:
            eng.arm.ready()
            self._switch(ctx, eng, patches)

        self._guard(ctx, eng, ready, good_end=good_end)
        t = time.perf_counter()
        out = self._guard(ctx, eng, probe, good_end=good_end)
        ctx.costs["probe_s"] += time.perf_counter() - t
        return out

    # -- engines -------------------------------------------------------------------------------
    def _engine_for(self, ctx: _TrialContext, patches: Mapping[str, str],
                    trial_dir: Path) -> HotEngine:
        """The engine of λ(patches): the one up, else one launched in `patches` itself (its
        first trial is then a fresh launch's; the next trials of λ are switched in it)."""
        key = self.engine_key(patches)
        up = self._pool.get(key)
        if up is not None:
            return up
        eng_dir = new_dir(trial_dir.parent.parent / "engines", key[:12])
        cfg = with_env(self.config(patches), {envvars.SWITCH_DIR: str(eng_dir / "switch"),
                                              envvars.HOT: self.hot_wire})
        eng = self._launch(ctx, "hot", patches, cfg, eng_dir)
        self._pool.add(key, eng)
        return eng

    def _launch(self, ctx: _TrialContext, name: str, patches: Mapping[str, str],
                cfg: EngineConfig, eng_dir: Path) -> HotEngine:
        """An engine launched in `patches` (`cfg`: with the hot environment, or none for the
        confirmation), room made for it in the pool first."""
        self._pool.make_room()
        self.launches += 1
        eng = HotEngine(patches, cfg, EngineArm(name, cfg, eng_dir, self._supervisor,
                                                self.on_event), eng_dir / "switch")
        t = time.perf_counter()
        self._guard(ctx, eng, eng.arm.ready, good_end=dict(patches) == self.good)
        ctx.costs["launch_s"] += time.perf_counter() - t
        eng.launch = eng.arm.launch
        return eng

    def _switch(self, ctx: _TrialContext, eng: HotEngine, patches: Mapping[str, str]) -> None:
        """Bring the running engine to `patches` (after a crash relaunch: from its base)."""
        launch = eng.arm.launch
        if launch is not eng.launch:  # relaunched: the process starts from the base state
            eng.launch, eng.current = launch, dict(eng.base)
        if eng.current == dict(patches):
            return
        t = time.perf_counter()
        eng.generation += 1
        # settings (bisect/setting_candidates.py) are load-time: the engine's base holds them
        switching.write_request(eng.dir, eng.generation, format_patch_set(
            {n: v for n, v in patches.items() if not is_setting(n)}, builtin_patches()))
        assert launch is not None
        for proc in launch.procs:  # type: ignore[attr-defined]
            if proc.spec.gets_patches:
                client = ProbeClient(proc.url, api_key=self.api_key, timeout_s=60, retries=1)
                try:
                    client.flush_cache()
                finally:
                    client.close()
        switching.wait_receipts(eng.dir, eng.generation, switching.expected_receipts(eng.cfg),
                                SWITCH_TIMEOUT_S)
        if eng.cfg.kind == "reference":  # the engine must now report exactly the new set
            verify_reference_patches(self.config(patches), server_info(launch.url))
        eng.current = dict(patches)
        eng.switches += 1
        ctx.costs["switch_s"] += time.perf_counter() - t

    def _guard(self, ctx: _TrialContext, eng: HotEngine, work: Callable[[], T], *,
               good_end: bool = False) -> T:
        """run/trial.py's guard, for an engine that outlives the trial: one that crashed or
        cannot serve leaves the pool; a candidate's crash is decided here (no cached-baseline or
        relaunch note: the good end is measured once per seed block); a PatchError (a switch
        that did not take) is the engine's fault; an EngineError gets the log tail (a switch's
        or a receipt's error does not carry it, unlike a launch's)."""
        return guard(ctx.spec, eng.arm, work, good_end=good_end,
                     crash_note="the good end ran without crashing",
                     lost=lambda: self._pool.drop(eng), broken=(EngineError, PatchError),
                     engine_tail=True)
