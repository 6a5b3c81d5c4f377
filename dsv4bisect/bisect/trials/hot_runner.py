"""The hot runner: one engine kept up across trials, patches switched inside it.

A trial of configuration C runs in the engine of C's load-time state λ(C) (the candidates whose
effect is fixed at load, `Question.load_time`). When no engine of λ(C) is up, one is launched in
C itself (hot environment on, so it can be switched later): that trial is then a fresh launch's,
and its result says so (`fresh_launch`), which can stand as the fresh confirmation of a culprit
set (driver.py). Later trials of the same λ are switched in that engine by the protocol of
base/switching.py (drain, request, `/flush_cache`, a receipt from every process naming the
generation, verified before any probe request).
The runner is four parts and the trial policy (dsv4bisect/policy.py) that rules them:
- the engine pool with the switch protocol (trials/engine_pool.py): the engines kept up at once,
  `pool` of them (the embedded engine: 2; one SGLang node: 1; the least recently used stops
  first), launched, switched and guarded;
- the ends book (trials/ends_book.py): each seed block's ends, measured or adopted, the A/A
  verdict to report, the probes started ahead of the good end's run;
- the probing policy (trials/probing.py): what each trial probes, pure, the Ray runner's too:
  the good end's baseline (full size) and its A/A repeat are measured right after the launch
  of the good end, before any switch, so they are a fresh launch's (and are cached as such; the
  baseline of a later seed block, measured in a switched engine, is not cached); the ∅ end
  check's verdict is then the A/A verdict (the repeat judged against the baseline); the bad end
  is probed at full size, or in two looks (`policy.end_looks`); any other configuration gets
  the sequential trial probe (probe/sequential_run.py) against the two ends once both are
  measured for the seed block, else a full probe;
- the ends' probes (trials/end_probes.py): a seed block's good end from the cache or measured,
  and where the policy probes the ends in two looks (bisect/end_looks.py), look 1 of both ends
  first and look 2 (the full tier) only where the bad end's look 1 does not settle them; the
  block's trials then use the spec of the look that settled it.
What one trial did (its spec, costs, the engine it probed in, the ends it measured) is its
`TrialContext`, never the runner's state; a probe collects by run/trial.py's `collect_on`.
Ends measured on another machine of the same bisect (the Ray executor's other nodes) are
installed with `adopt_ends` before a trial: checked against this runner's probe spec, seed block
and good end, they serve as if measured here, so this runner measures no good end another one
measured, and probes sequentially once any node ran the bad end. Their A/A verdict is the
measuring node's (already reported by its trial): a ∅ end check of an adopted seed block has
that verdict, launches nothing and reports no A/A verdict again. A trial's details name the ends
it measured (`ends_measured`: `b<block>/<end>`, or `b<block>/look<k>/<end>` with looks, under
`ends_dir`) and those it used from another
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
from collections.abc import Mapping, Sequence
from pathlib import Path

from dsv4bisect import env as envvars
from dsv4bisect.bisect import end_looks
from dsv4bisect.bisect.trials import ends_book
from dsv4bisect.bisect.trials.end_probes import EndProbes
from dsv4bisect.bisect.trials.ends_book import BlockEnds, EndsBook, FromRun, RunCache, Settled
from dsv4bisect.bisect.trials.engine_pool import EnginePool, HotEngine, new_dir, with_env
from dsv4bisect.bisect.trials.engine_runner import (
    EngineRunner,
    aa_verdict,
    result_details,
    signature_of,
    throughput,
)
from dsv4bisect.bisect.trials.probing import Probe, ProbingPolicy
from dsv4bisect.bisect.trials.runner import FreshLaunch, TrialResult
from dsv4bisect.bisect.trials.trial_probes import Probed, TrialContext, TrialProbes
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.engines.rundir import save_config
from dsv4bisect.errors import ConfigError, Dsv4BisectError
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patching.wire import format_patch_set
from dsv4bisect.policy import TrialPolicy
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import judge
from dsv4bisect.probe.sequential import TRIAL_ERROR_RATES
from dsv4bisect.probe.session import write_verdict
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.run.arm import Supervisor
from dsv4bisect.run.events import EventSink, Notice, ignore
from dsv4bisect.run.trial import Stop

HOT_MARKER = "hot-v1"
SEQUENTIAL_RULES = 2  # bump when probe/sequential.py decides differently: no reuse of old verdicts
HOT_POLICY = TrialPolicy(hot=True, sequential=True)  # a hot runner's, unless it is given one


class HotEngineRunner(EngineRunner):
    """`EngineRunner` with hot switching (see the module docstring). `good`, `bad`: the patch
    sets of the two ends as the search names them (`BisectSpec.patches_for`); `policy`: the
    bisect's trial policy (its sequential probe, how it counts a WARN, how it judges drift);
    `run_bad`: the bad end as `run` of the profile measures it, where it differs from `bad` in
    patches left out as inert (whose cached candidate serves as the bad end: end_probes.py)."""

    hot = True

    def __init__(self, profile: str, good: Mapping[str, str], bad: Mapping[str, str], *,
                 load_time: Sequence[str] = (), sets: Sequence[str] = (),
                 tier: str | None = None, use_cache: bool = True, pool: int | None = None,
                 policy: TrialPolicy = HOT_POLICY,
                 error_rates: tuple[float, float] = TRIAL_ERROR_RATES,
                 good_config: str | None = None, run_bad: Mapping[str, str] | None = None,
                 on_event: EventSink = ignore) -> None:
        super().__init__(profile, good, sets=sets, tier=tier, use_cache=use_cache,
                         good_config=good_config, on_event=on_event)
        self.bad = dict(bad)
        # the bad end as a failing `run` measured it (its inert left-out patches on)
        self.run_bad = dict(run_bad) if run_bad is not None else self.bad
        self.load_time = frozenset(load_time)
        self.policy, self.error_rates = policy, error_rates
        self.probing = ProbingPolicy(self.good, self.bad, policy)
        hot = {n: v for n, v in self.bad.items() if n not in self.load_time
               and self.good.get(n) != v}
        self.hot_wire = format_patch_set(hot, builtin_patches())
        size = pool if pool is not None else (2 if self.good_cfg.kind == "reference" else 1)
        self._supervisor = Supervisor()
        self._pool = EnginePool(size, config=self.config, api_key=self.api_key,
                                supervisor=self._supervisor, on_event=on_event)
        self._ends = EndsBook()
        self._probes = TrialProbes(self._pool, api_key=self.api_key, policy=policy,
                                   error_rates=error_rates, on_event=on_event,
                                   fingerprint=self.fingerprint)
        self._end_probes = EndProbes(self._ends, self._probes, spec=lambda: self.spec,
                                     policy=policy, good=self.good,
                                     good_fingerprint=self.good_cfg.fingerprint,
                                     bad_fingerprint=self.config(self.run_bad).fingerprint,
                                     use_cache=use_cache, engine_for=self._engine_for,
                                     on_event=on_event)
        self._run_lock = threading.Lock()  # one trial at a time: one engine pool, one node

    @property
    def launches(self) -> int:
        """Engines this runner launched (a crash relaunch counts once more)."""
        return self._pool.launches

    # -- identity ------------------------------------------------------------------------------
    @property
    def probe_hash(self) -> str:
        """The engine runner's, plus the rules a sequential trial is judged by (its error
        rates, how it counts a drift WARN, how it judges drift): a verdict means those too.
        Drift judged against the two ends means the bad end as well: the same trial in a bisect
        with another bad end is another measurement, never reused from the ledger."""
        rules = {"engine": super().probe_hash, "rules": SEQUENTIAL_RULES,
                 "error_rates": list(self.error_rates), **self.policy.judging_rules(),
                 "bad": self.config(self.bad).fingerprint if self.policy.drift_relative
                 else None}
        if self.policy.end_looks:  # trials replay the cases of the look that settled the ends
            rules["end_looks"] = [self.look_spec(0, 1).case_share,
                                  end_looks.LOOK1_ALPHA_OVERALL, end_looks.LOOK1_ALPHA_CELL]
        return hashlib.sha256(json.dumps(rules, sort_keys=True).encode()).hexdigest()[:32]

    def look_spec(self, block: int, look: int) -> ProbeSpec:
        """The spec of `look` of seed block `block`'s ends (the full tier with full ends)."""
        return self._end_probes.look_spec(block, look)

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
        sent (split across `replicas` as `run` splits the probe), kept in the ends book for the
        next `run` of the same trial, which scores the drift part once it has the good end's
        run. Returns the rows sent; 0 where it could not (an engine that cannot serve, a lost
        replica: the trial then probes from the start, as without it)."""
        with self._run_lock:
            block = self._ends.block(seed_block)
            if seed_block == 0 and (block.from_run is not None or (
                    not block.known and self._end_probes.run_ends(
                        block, ends_book.ends_dir(trial_dir)))):
                return 0  # the ends a failing `run` measured: nothing to probe ahead
            ctx = TrialContext(self.look_spec(seed_block, block.look),
                               replicas=tuple(replicas), patches=dict(patches))
            key = (self.fingerprint(patches), seed_block)
            self._ends.keep_ahead(key, None)
            try:
                eng = self._engine_for(ctx, patches, trial_dir)
                runs = self._probes.start_ahead(ctx, eng, patches)
            except (Stop, Dsv4BisectError, OSError) as exc:
                self.on_event(Notice(f"the probe of {sorted(patches)} could not start ahead of "
                                     f"the good end ({exc}): it runs whole", "warn"))
                return 0
            self._ends.keep_ahead(key, (runs, dict(ctx.costs)))
            return sum(len(r.rows) for r in runs)

    def replica(self, patches: dict[str, str], trial_dir: Path) -> str:
        """Bring the engine of λ(`patches`) up and switch it to `patches` (receipts verified,
        as before any probe here), for another node's trial to send part of its probe to;
        returns its url. Raises `Stop` when the engine cannot serve."""
        with self._run_lock:
            ctx = TrialContext(self.spec)
            eng = self._engine_for(ctx, patches, trial_dir)
            self._probes.ready(ctx, eng, patches)
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
    ends_dir = staticmethod(ends_book.ends_dir)

    @property
    def engines_up(self) -> tuple[str, ...]:
        """The load-time states whose engine is up (`engine_key`)."""
        return self._pool.up

    def adopt_ends(self, block: int, base: ProbeRun | None, repeat: ProbeRun | None,
                   bad: ProbeRun | None, *, good_fingerprint: str, source: str,
                   look: int | None = None, settled: Settled | None = None,
                   from_run: FromRun | None = None) -> list[str]:
        """Install ends of seed block `block` measured by `source` (another node of this
        bisect, or the `run` whose cache the driver found: `from_run`) for the next trials
        (`EndsBook.adopt`: `look`, the look their names say; `settled`, the look that settled
        the block); returns the ends installed."""
        looks = {k: self.look_spec(block, k) for k in (1, 2)}
        return self._ends.adopt(block, base, repeat, bad, looks=looks,
                                good=self.good_cfg.fingerprint,
                                good_fingerprint=good_fingerprint, source=source, look=look,
                                settled=settled, from_run=from_run)

    def run_cache(self) -> RunCache | None:
        """The ends a failing `run` cached for seed block 0, as this runner would install
        them (`EndProbes.run_cache`; a refused entry warns): what the Ray driver sends."""
        return self._end_probes.run_cache()

    def _trial(self, patches: dict[str, str], block: int, trial_dir: Path, fresh: bool,
               replicas: tuple[str, ...] = ()) -> TrialResult:
        t0 = time.perf_counter()
        cfg = self.config(patches)
        if cfg.cannot_start:
            raise ConfigError(f"configuration {patches} cannot start: {cfg.cannot_start}",
                              "keep required patches at their good-end state")
        first = self._ends.blocks.get(0)
        judged_by = self.probing.seed_block(patches, block, first is not None and first.known
                                            and first.bad is not None)
        ctx = TrialContext(self.spec.replace(seed_block=judged_by), replicas=replicas,
                            patches=dict(patches))
        save_config(trial_dir / "candidate", cfg)
        measured_base = False
        eng: HotEngine | None = None  # the confirmation's own engine
        try:
            ends, measured_base = self._end_probes.ends_for(ctx, trial_dir)
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
        details = result_details(verdict, ends_cached=not measured_base,
                                 run_dir=trial_dir, command=self.reproduce(patches, block))
        details.update(mode="fresh" if fresh else "hot", requests=requests,
                       base=self.base_of(patches), launched_as=used.base if used else None,
                       fresh_launch=fresh or bool(used and used.fresh_in(patches)),
                       ends_measured=list(ctx.measured),
                       ends_from=dict(sorted(self._ends.block(ctx.spec.seed_block)
                                             .came_from.items())),
                       shards=1 + len(ctx.replicas) if ctx.sharded else 1,
                       relaunched=self._pool.take_relaunches(), **ctx.looks,
                       **self._from_run(patches, ctx.spec.seed_block),
                       **{k: round(v, 3) for k, v in ctx.costs.items()})
        return TrialResult(verdict=verdict.verdict, signature=signature_of(verdict),
                           duration_s=time.perf_counter() - t0, details=details,
                           throughput=throughput(cand), aa_verdicts=self._ends.take_aa(block),
                           error_rates=verdict.error_rates, requests=requests)

    # -- the ends ------------------------------------------------------------------------------
    def _from_run(self, patches: Mapping[str, str], block: int) -> dict[str, str]:
        """An end's trial of a block whose ends a failing `run` measured: that run's directory
        (`ends_from_run`, in its details)."""
        from_run = self._ends.block(block).from_run
        if from_run is None or not self.probing.is_end(patches):
            return {}
        return {"ends_from_run": str(from_run.source_run)}

    # -- probing -------------------------------------------------------------------------------
    def _probe(self, ctx: TrialContext, patches: dict[str, str], ends: BlockEnds,
               measured_base: bool, fresh_eng: HotEngine | None, trial_dir: Path,
               draw: int) -> Probed:
        base, repeat, bad = ends.baseline, ends.repeat, ends.bad
        assert base is not None
        if ends.from_run is not None and self.probing.is_bad(patches) and fresh_eng is None:
            return self._end_probes.cached_bad_end(ctx, ends, trial_dir)
        ahead = (self.fingerprint(patches), draw)  # a probe started ahead, kept under it
        # the good end measured in a fresh launch: here, on another node, or by a `run`
        probe = self.probing.probe(
            patches, good_end_fresh=(measured_base or ends.adopted("baseline")
                                     or ends.from_run is not None),
            bad_known=bad is not None, confirmation=fresh_eng is not None,
            ahead=self._ends.has_ahead(ahead))
        if probe is Probe.AA_CHECK:
            # The ∅ end check: the good end was just measured twice in a fresh launch (here,
            # or on the node these ends came from, whose trial reported the A/A verdict).
            assert repeat is not None
            return aa_verdict(base, repeat), repeat, 0
        eng = fresh_eng or self._engine_for(ctx, patches, trial_dir)
        ctx.probed_in = eng
        if probe is Probe.SEQUENTIAL:
            assert bad is not None
            outcome = self._probes.sequential(ctx, eng, patches, (base, repeat, bad), draw)
            saved = outcome.save(trial_dir / "candidate")
            return saved.as_verdict(), saved.run, saved.decision.requests
        started = self._ends.take_ahead(ahead)
        label = ("good end (re-test)" if self.probing.is_good(patches) else
                 "bad end" if self.probing.is_bad(patches) else "candidate")
        cand = (self._probes.finish_ahead(ctx, eng, patches, base, started)
                or self._probes.collect(ctx, eng, patches, base, label, good_end=False))
        verdict, requests = judge(base, repeat, cand), len(cand.rows)
        if not self.probing.is_bad(patches):
            return verdict, cand.save(trial_dir / "candidate"), requests
        return self._end_probes.bad_end(ctx, patches, ends, verdict, cand, trial_dir)

    # -- engines (the pool's, with this trial's costs) ----------------------------------------
    def _engine_for(self, ctx: TrialContext, patches: Mapping[str, str],
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

    def _launch(self, ctx: TrialContext, name: str, patches: Mapping[str, str],
                cfg: EngineConfig, eng_dir: Path) -> HotEngine:
        """An engine launched in `patches` (`cfg`: with the hot environment, or none for the
        confirmation), ready."""
        eng = self._pool.new(name, patches, cfg, eng_dir)
        t = time.perf_counter()
        self._pool.guard(ctx.spec, eng, eng.arm.ready,
                         good_end=self.probing.is_good(patches))
        ctx.costs["launch_s"] += time.perf_counter() - t
        eng.launch = eng.arm.launch
        return eng
