"""How a hot runner measures a seed block's ends (bisect/trials/hot_runner.py): the good end's
baseline and A/A repeat (from the baseline cache, or measured on the engine of λ = ∅), and the
bad end's looks where the trial policy probes the ends in two (`policy.end_looks`;
bisect/end_looks.py, docs/bisect.md "Ends that stop when their question is answered"): look 1
first, and look 2 — both ends at the full tier, sending only the cases look 1 did not keep
(probe/looks.py) — only where the bad end's look-1 verdict does not settle the block. The look that settled a block is recorded in its `BlockEnds` and in
`settled.json` beside its runs (`ends/b<block>/look<k>/<end>`), where a resumed bisect finds it;
with full ends the runs are `ends/b<block>/<end>` as before.

The ends a failing `run` measured (docs/bisect.md, "The ends a failing run already measured"):
seed block 0's good end from the baseline cache at the full tier, and where the run also
cached its candidate (run/candidate_cache.py: the bad end, the same configuration) judged
against that very baseline entry, both are installed as the block's settled full-tier ends
(`run_ends`): no request is sent for either, the ∅ end check is their A/A verdict, the bad
end's trial is `judge` of the cached runs (`cached_bad_end`). On the Ray executor the driver
makes the same lookup (`run_cache`) and sends those ends to every node, whose runner adopts
them with the run they came from (ends_book.py `FromRun`; cluster/shared_ends.py), so its bad
end's trial is `cached_bad_end` too, with no cache on the node. A look-1 good end whose own
entry is missing is the full tier's entry restricted to look 1's cases (probe/looks.py
`restrict`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from dsv4bisect.bisect import end_looks
from dsv4bisect.bisect.trials.ends_book import (
    BlockEnds,
    EndsBook,
    FromRun,
    RunCache,
    end_name,
    ends_dir,
    read_settled,
    write_settled,
)
from dsv4bisect.bisect.trials.engine_pool import HotEngine
from dsv4bisect.bisect.trials.engine_runner import aa_verdict
from dsv4bisect.bisect.trials.trial_probes import TrialContext, TrialProbes
from dsv4bisect.errors import ConfigError
from dsv4bisect.policy import TrialPolicy
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.looks import restrict
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import judge
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.run import baseline as cache
from dsv4bisect.run import candidate_cache
from dsv4bisect.run.events import EventSink, Notice

EngineFor = Callable[[TrialContext, Mapping[str, str], Path], HotEngine]


class EndProbes:
    """The ends of a hot runner's seed blocks, measured: `spec` reads the runner's probe spec
    (block 0; the runner's own, so a spec set there is the one the ends use), `good` the good
    end's patches and `good_fingerprint` its configuration's, `engine_for` the runner's engine
    of a patch set's load-time state (launched if none is up); `bad_fingerprint`: the bad end's
    configuration's (a `run`'s cached candidate)."""

    def __init__(self, book: EndsBook, probes: TrialProbes, *, spec: Callable[[], ProbeSpec],
                 policy: TrialPolicy, good: Mapping[str, str], good_fingerprint: str,
                 bad_fingerprint: str, use_cache: bool, engine_for: EngineFor,
                 on_event: EventSink) -> None:
        # the runner's spec, read where used: one value for its trials and its ends
        self.book, self.probes, self.spec_of, self.policy = book, probes, spec, policy
        self.good, self.good_fingerprint, self.use_cache = dict(good), good_fingerprint, use_cache
        self.bad_fingerprint = bad_fingerprint
        self.engine_for, self.on_event = engine_for, on_event

    def look_spec(self, block: int, look: int) -> ProbeSpec:
        """The spec of `look` of seed block `block`'s ends (the full tier with full ends)."""
        spec = self.spec_of().replace(seed_block=block)
        return end_looks.look_spec(spec, look) if self.policy.end_looks else spec

    def look_dir(self, look: int) -> int | None:
        """The look in an end's directory name (`end_name`): none with full ends."""
        return look if self.policy.end_looks else None

    def ends_for(self, ctx: TrialContext, trial_dir: Path) -> tuple[BlockEnds, bool]:
        """The good end's baseline and A/A repeat for this seed block (measured now on the
        engine of λ = ∅ if not cached: then `True`), and the bad end's run once measured; the
        trial's spec becomes the spec of the block's look (the settled one where a resumed
        bisect's ends say so: `settled.json`)."""
        block = ctx.spec.seed_block
        ends = self.book.block(block)
        root = ends_dir(trial_dir)
        settled = (read_settled(root, block) if self.policy.end_looks and not ends.known
                   else None)
        if settled is not None:
            ends.look, ends.settled_by = settled
        elif block == 0 and not ends.known:
            self.run_ends(ends, root)
        ctx.spec = self.look_spec(block, ends.look)
        if ends.known:
            return ends, False
        measured = self.good_end(ctx, ends, trial_dir, report_aa=True)
        bad_dir = root / end_name(block, "bad", self.look_dir(ends.look))
        if (ends.bad is None and (settled is not None or not self.policy.end_looks)
                and (bad_dir / "run.json").exists()):
            ends.bad = ProbeRun.load(bad_dir)
        return ends, measured

    def good_end(self, ctx: TrialContext, ends: BlockEnds, trial_dir: Path, *,
                 report_aa: bool, earlier: tuple[ProbeRun | None, ProbeRun | None] = (None, None)
                 ) -> bool:
        """The good end's baseline and A/A repeat at `ctx.spec` (the block's look), from the
        cache or measured on the engine of λ = ∅ (then `True`). `report_aa`: its A/A verdict
        is the next trial's to report; else (look 2, measured in the bad end's trial) it goes
        in the trial's details only, not the good end's noise evidence. `earlier`: look 1's
        baseline and repeat, whose cases look 2 does not probe again (probe/looks.py)."""
        block, look = ctx.spec.seed_block, self.look_dir(ends.look)
        root = ends_dir(trial_dir)
        names = end_name(block, "baseline", look), end_name(block, "baseline-repeat", look)
        key = cache.BaselineKey.of(self.good_fingerprint, ctx.spec)
        hit, why = cache.lookup(key) if self.use_cache else (None, None)
        if why:
            self.on_event(Notice(why, "warn"))
        if hit is not None:
            ends.baseline, ends.repeat = hit.install(root / names[0], root / names[1])
            return False
        if self.use_cache and self.full_good_end(ctx.spec, ends, root, names):
            return False
        eng = self.engine_for(ctx, self.good, trial_dir)
        ctx.probed_in = eng
        fresh = eng.fresh_in(self.good)  # not an engine launched in another set of λ = ∅
        base = self.probes.collect(ctx, eng, self.good, None, "baseline", good_end=True,
                                   earlier=earlier[0]).save(root / names[0])
        ref, _subset = cache.repeat_reference(base)
        repeat = self.probes.collect(ctx, eng, self.good, ref, "A/A repeat", good_end=True,
                                     earlier=earlier[1]).save(root / names[1])
        ends.baseline, ends.repeat = base, repeat
        aa = aa_verdict(base, repeat).verdict
        if report_aa:
            ends.aa = (aa,)
        else:
            ctx.looks["look2_aa"] = aa
        ctx.measured += list(names)
        if not fresh:  # a re-test's seed block, or a second look, in a switched engine
            self.on_event(Notice(f"baseline of seed block {block} measured in a hot-"
                                 "switched engine: not cached", "warn"))
        elif eng.arm.verified is True:
            try:
                cache.store(key, root / names[0], root / names[1])
            except OSError as exc:
                self.on_event(Notice(f"baseline not cached: {exc}", "warn"))
        return True

    def full_good_end(self, spec: ProbeSpec, ends: BlockEnds, root: Path,
                      names: tuple[str, str]) -> bool:
        """A look's good end (`spec`, named `names`) from the full tier's cache entry (the one
        a `run` left), restricted to the look's cases (`restrict`); the full pair is installed
        as look 2's. False where `spec` is the full tier or no entry restricts."""
        full = spec.replace(case_share=1.0)
        if full.spec_hash() == spec.spec_hash():
            return False
        hit, why = cache.lookup(cache.BaselineKey.of(self.good_fingerprint, full))
        if why:
            self.on_event(Notice(why, "warn"))
        if hit is None:
            return False
        block = spec.seed_block
        base, repeat = hit.install(root / end_name(block, "baseline", 2),
                                   root / end_name(block, "baseline-repeat", 2))
        try:
            ends.baseline = restrict(base, spec).save(root / names[0])
            ends.repeat = (restrict(repeat, spec, whole=False).save(root / names[1])
                           if repeat is not None else None)
        except ConfigError as exc:
            self.on_event(Notice(f"the full tier's cached baseline {hit.path} does not restrict "
                                 f"to look 1 ({exc.message}): measured", "warn"))
            ends.baseline = ends.repeat = None
            return False
        self.on_event(Notice(f"the good end's look 1 of seed block {block} is the full tier's "
                             f"cached baseline ({hit.path}, made {hit.created_at}) restricted "
                             "to look 1's cases"))
        return True

    def run_cache(self) -> RunCache | None:
        """The cache entries a failing `run` left for seed block 0 (`candidate_cache.run_ends`
        at the full tier) and the look the block's ends are then named by: the full tier's
        (None with full ends); None where nothing is cached, `--no-cache`, or an entry is
        refused (a candidate of another baseline, a damaged entry: a warning says why). The
        Ray driver looks up the same (cluster/shared_ends.py `DriverEnds.keep_run`)."""
        if not self.use_cache:
            return None
        full = self.look_spec(0, 2)
        found, why = candidate_cache.run_ends(self.good_fingerprint, self.bad_fingerprint, full)
        if why:
            self.on_event(Notice(why, "warn"))
        if found is None:
            return None
        look = (None if not self.policy.end_looks else
                1 if self.look_spec(0, 1).spec_hash() == full.spec_hash() else 2)
        return RunCache(*found, look)

    def run_ends(self, ends: BlockEnds, root: Path) -> bool:
        """Seed block 0's ends from the cache a failing `run` left (module docstring): the
        good end's full-tier pair and the run's candidate judged against it, installed as
        the block's settled full-tier ends (`True`); else nothing changes (a candidate of
        another baseline or a damaged entry: a warning, the ends are probed as before)."""
        run = self.run_cache()
        if run is None:
            return False
        look = run.look
        ends.baseline, ends.repeat = run.good.install(root / end_name(0, "baseline", look),
                                                      root / end_name(0, "baseline-repeat", look))
        ends.bad = run.bad.install(root / end_name(0, "bad", look))
        ends.from_run = FromRun.of(run)
        if look is not None:
            ends.look, ends.settled_by = look, None
            write_settled(root, 0, look, None)
        self.on_event(Notice(f"seed block 0's ends are the ones a run measured "
                             f"({ends.from_run.describe()}): no request is sent for them; "
                             "--no-cache measures them again"))
        return True

    def cached_bad_end(self, ctx: TrialContext, ends: BlockEnds, trial_dir: Path
                       ) -> tuple[V.Verdict, ProbeRun, int]:
        """The bad end's trial of a block whose ends a `run` measured (`run_ends`): its
        cached run judged against the cached good end, no request sent."""
        assert ends.from_run is not None and ends.baseline is not None and ends.bad is not None
        verdict = judge(ends.baseline, ends.repeat, ends.bad)
        if self.policy.end_looks:
            ctx.looks.update(end_look=ends.look, settled_by=ends.settled_by)
        ctx.looks.update(bad_end_cached=True, bad_end_from=ends.from_run.source_run)
        return verdict, ends.bad.save(trial_dir / "candidate"), 0

    def bad_end(self, ctx: TrialContext, patches: dict[str, str], ends: BlockEnds,
                verdict: V.Verdict, cand: ProbeRun, trial_dir: Path
                ) -> tuple[V.Verdict, ProbeRun, int]:
        """The bad end's trial after its probe at the block's look (`cand`, judged `verdict`):
        where the block is not settled yet, its looks (`second_look`), then the run kept as
        the block's bad end (an adopted one stays: every node judges against it). Returns the
        trial's verdict, its run and the requests it sent."""
        block, requests = ctx.spec.seed_block, len(cand.rows)
        if self.policy.end_looks and ends.bad is None:  # the block is not settled yet
            verdict, cand, requests = self.second_look(ctx, patches, ends, verdict, cand,
                                                       trial_dir)
            write_settled(ends_dir(trial_dir), block, ends.look, ends.settled_by)
        if self.policy.end_looks:
            ctx.looks.update(end_look=ends.look, settled_by=ends.settled_by)
        cand = cand.save(trial_dir / "candidate")
        name = end_name(block, "bad", self.look_dir(ends.look))
        cand.save(ends_dir(trial_dir) / name)
        if ends.bad is None or not ends.adopted("bad"):
            ends.bad = cand
        ctx.measured.append(name)
        return verdict, cand, requests

    def second_look(self, ctx: TrialContext, patches: dict[str, str], ends: BlockEnds,
                    verdict: V.Verdict, cand: ProbeRun, trial_dir: Path
                    ) -> tuple[V.Verdict, ProbeRun, int]:
        """Whether the bad end's look-1 `verdict` (of `cand`) settles the block's ends
        (`end_looks.settles`: the block keeps look 1), else both ends at the full tier (look 2:
        the good end's pair from the cache or measured, then the bad end; each sends only the
        requests of the cases look 1 did not keep, look 1's own are added: probe/looks.py),
        whose verdict is the trial's. Returns the verdict, the bad end's run and the requests
        the trial sent (the look-2 good end's included)."""
        block = ctx.spec.seed_block
        requests = len(cand.rows)
        why = end_looks.settles(verdict)
        full = self.look_spec(block, 2)
        if ends.look == 2:  # a retry of a bad end whose first try stopped in look 2
            ends.settled_by = None
            return verdict, cand, requests
        if why is not None or ctx.spec.spec_hash() == full.spec_hash():
            ends.settled_by = why  # settled, or look 1 is the whole tier
            return verdict, cand, requests
        self.on_event(Notice(f"the bad end's first look ({requests} requests, "
                             f"{verdict.verdict}) does not settle the ends: both ends go on "
                             "to the full tier (the cases look 1 did not keep)"))
        look1 = cand.save(trial_dir / "candidate-look1")
        earlier = (ends.baseline, ends.repeat)
        ctx.spec, ends.look = full, 2
        if self.good_end(ctx, ends, trial_dir, report_aa=False, earlier=earlier):
            requests += sum(len(r.rows) - (len(e.rows) if e else 0)  # look 1's were sent
                            for r, e in zip((ends.baseline, ends.repeat), earlier) if r)
        assert ends.baseline is not None
        eng = self.engine_for(ctx, patches, trial_dir)
        ctx.probed_in = eng
        cand = self.probes.collect(ctx, eng, patches, ends.baseline, "bad end (full tier)",
                                   good_end=False, earlier=look1)
        requests += len(cand.rows) - len(look1.rows)
        return judge(ends.baseline, ends.repeat, cand), cand, requests
