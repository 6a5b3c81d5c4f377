"""How a hot trial probes, on an engine of the pool (bisect/trials/hot_runner.py): a full probe
(or the one started ahead of the good end's run, finished), the sequential trial probe, the
accuracy part sent ahead. What to probe is the probing policy's (trials/probing.py); here each
probe runs guarded by the pool, its engine switched to the trial's patches first (and again
inside the arm's probe: a crash relaunch starts from the base), its seconds counted in the
trial's own context (`TrialContext`), split across replicas where the trial has them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dsv4bisect.bisect.trials.ends_book import Ahead
from dsv4bisect.bisect.trials.engine_pool import EnginePool, HotEngine
from dsv4bisect.errors import Dsv4BisectError
from dsv4bisect.policy import TrialPolicy
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.computed import run_computed
from dsv4bisect.probe.looks import earlier_cases, extend
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.run.events import EventSink, Notice
from dsv4bisect.run.trial import collect_on, probe_progress

T = TypeVar("T")
Probed = tuple[V.Verdict, "ProbeRun | None", "int | None"]  # verdict, its run, its requests


@dataclass
class TrialContext:
    """One trial's own state: the spec a verdict that stops it records (its seed block), the
    seconds it spent launching, switching and probing and the prompt tokens its probes computed
    (`probe.computed.run_computed`: what --plan prices a probe second at), the engine it probed
    in and the ends it measured (`b<block>/<end>`); `looks`: for a bad end's trial where the
    ends are probed in looks, the look that settled them and why (its details)."""

    spec: ProbeSpec
    costs: dict[str, float] = field(
        default_factory=lambda: {"launch_s": 0.0, "switch_s": 0.0, "probe_s": 0.0,
                                 "computed_tokens": 0.0})
    probed_in: HotEngine | None = None
    measured: list[str] = field(default_factory=list)
    replicas: tuple[str, ...] = ()  # urls of other nodes' engines in `patches`
    patches: dict[str, str] = field(default_factory=dict)  # the trial's configuration
    sharded: bool = False  # whether the probe really ran across them (else on this engine)
    looks: dict[str, Any] = field(default_factory=dict)


class TrialProbes:
    """The probes of a hot runner's trials. `fingerprint`: the runner's (a sequential trial
    draws its own order per configuration and re-test from it)."""

    def __init__(self, pool: EnginePool, *, api_key: str | None, policy: TrialPolicy,
                 error_rates: tuple[float, float], on_event: EventSink,
                 fingerprint: Callable[[Mapping[str, str]], str]) -> None:
        self.pool, self.api_key, self.policy = pool, api_key, policy
        self.error_rates, self.on_event, self.fingerprint = error_rates, on_event, fingerprint

    def switch(self, ctx: TrialContext, eng: HotEngine, patches: Mapping[str, str]) -> None:
        ctx.costs["switch_s"] += self.pool.switch(eng, patches)

    def ready(self, ctx: TrialContext, eng: HotEngine, patches: Mapping[str, str], *,
              good_end: bool = False) -> None:
        """`eng` up and switched to `patches` (receipts verified), guarded."""
        def up() -> None:
            eng.arm.ready()
            self.switch(ctx, eng, patches)

        self.pool.guard(ctx.spec, eng, up, good_end=good_end)

    def timed(self, ctx: TrialContext, eng: HotEngine, patches: Mapping[str, str],
              probe: Callable[[], T], *, good_end: bool) -> T:
        """`probe` (which switches `eng` to `patches` again inside the arm's probe: a crash
        relaunch starts from the base), guarded; the engine is up and switched to `patches`
        before its clock starts."""
        self.ready(ctx, eng, patches, good_end=good_end)
        t = time.perf_counter()
        out = self.pool.guard(ctx.spec, eng, probe, good_end=good_end)
        ctx.costs["probe_s"] += time.perf_counter() - t
        return out

    def collect(self, ctx: TrialContext, eng: HotEngine, patches: Mapping[str, str],
                reference: ProbeRun | None, label: str, *, good_end: bool,
                earlier: ProbeRun | None = None) -> ProbeRun:
        """A full-size probe of `patches` (`reference`: the good end's run it replays);
        `earlier`: the same configuration's run of an earlier look of its ends, whose cases are
        not probed again but added (probe/looks.py)."""
        progress = probe_progress(self.on_event, label)
        replicas = ctx.replicas if dict(patches) == ctx.patches else ()  # in this configuration
        skip = earlier_cases(earlier) if earlier is not None else frozenset()
        run = self.timed(ctx, eng, patches, lambda: collect_on(
            eng.arm, ctx.spec, reference, self.api_key, progress,
            lambda: self.switch(ctx, eng, patches), replicas, skip), good_end=good_end)
        ctx.sharded = ctx.sharded or bool(replicas)
        ctx.costs["computed_tokens"] += run_computed(run.rows)
        return run if earlier is None else extend(earlier, run)

    def sequential(self, ctx: TrialContext, eng: HotEngine, patches: Mapping[str, str],
                   ends: tuple[ProbeRun, ProbeRun | None, ProbeRun], draw: int) -> Any:
        """The sequential trial probe of `patches` against `ends` (baseline, its A/A repeat,
        the bad end's run); `draw`: the trial's seed block (its own draw order)."""
        from dsv4bisect.probe.sequential_run import run_sequential

        (ff, fp), (base, repeat, bad) = self.error_rates, ends
        seed = int(hashlib.sha256(f"{self.fingerprint(patches)}:{draw}".encode())
                   .hexdigest()[:8], 16)

        def on(urls: Sequence[str]) -> Any:
            return run_sequential(urls, base, bad, repeat, false_fail=ff, false_pass=fp,
                                  seed=seed, api_key=self.api_key,
                                  model=eng.cfg.served_model_name, policy=self.policy)

        def work(url: str) -> Any:
            self.switch(ctx, eng, patches)
            if ctx.replicas:
                try:  # the same draws and decision as on one node (probe/shards.py)
                    out = on([url, *ctx.replicas])
                    ctx.sharded = True
                    return out
                except (Dsv4BisectError, OSError) as exc:  # a replica's node or engine lost:
                    self.on_event(Notice(f"sharded probe lost a replica ({exc}): probed on "
                                         "this node alone", "warn"))  # the same requests
            return on([url])

        out = self.timed(ctx, eng, patches, lambda: eng.arm.probe(work), good_end=False)
        ctx.costs["computed_tokens"] += run_computed(out.run.rows)
        return out

    def start_ahead(self, ctx: TrialContext, eng: HotEngine, patches: Mapping[str, str]
                    ) -> list[ProbeRun]:
        """The accuracy part of `patches`' full-size probe, before the good end's run exists
        (probe/ahead.py), split across the trial's replicas."""
        from dsv4bisect.probe.ahead import collect_ahead, collect_ahead_sharded

        def work(url: str) -> list[ProbeRun]:
            model = eng.cfg.served_model_name
            self.switch(ctx, eng, patches)
            if ctx.replicas:
                return collect_ahead_sharded([url, *ctx.replicas], ctx.spec,
                                             api_key=self.api_key, model=model)
            return [collect_ahead(url, ctx.spec, api_key=self.api_key, model=model)]

        out = self.timed(ctx, eng, patches, lambda: eng.arm.probe(work), good_end=False)
        ctx.costs["computed_tokens"] += sum(run_computed(run.rows) for run in out)
        return out

    def finish_ahead(self, ctx: TrialContext, eng: HotEngine, patches: Mapping[str, str],
                     base: ProbeRun, started: Ahead | None) -> ProbeRun | None:
        """The probe `start_ahead` started, finished against the good end's run `base` (its
        drift transcripts scored on the engines that ran each shard); None where none was
        started, or its cases are not the good end's (the probe then runs whole)."""
        from dsv4bisect.probe.ahead import OtherCases, finish_ahead, finish_ahead_sharded

        if started is None:
            return None
        runs, costs = started
        for name, seconds in costs.items():  # the trial's costs count its ahead part
            ctx.costs[name] += seconds
        model = eng.cfg.served_model_name

        def work(url: str) -> ProbeRun:
            self.switch(ctx, eng, patches)
            if len(runs) == 1:
                return finish_ahead(url, runs[0], base, api_key=self.api_key, model=model)
            # each shard where it ran; one whose replica is gone, here
            return finish_ahead_sharded([url], runs, base, api_key=self.api_key, model=model)

        try:
            run = self.timed(ctx, eng, patches, lambda: eng.arm.probe(work), good_end=False)
        except OtherCases as exc:
            self.on_event(Notice(f"{exc.message}: the candidate probes them again", "warn"))
            return None
        ctx.sharded = ctx.sharded or len(runs) > 1
        drift = (row for row in run.rows if row.get("arm") == "drift")  # the rest ran ahead
        ctx.costs["computed_tokens"] += run_computed(drift)
        return run
