"""Seed block 0's ends from the cache a failing `run` left (bisect/trials/end_probes.py
`run_ends`; docs/bisect.md, "The ends a failing run already measured"): installed as the
block's settled full-tier ends only where the cached candidate was judged against the very
baseline entry the good end installs; else a warning and the ends are probed as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bisect.bisect.trials.end_probes import EndProbes
from dsv4bisect.bisect.trials.ends_book import EndsBook
from dsv4bisect.bisect.trials.trial_probes import TrialContext
from dsv4bisect.policy import TrialPolicy
from dsv4bisect.run import baseline as cache
from dsv4bisect.run import candidate_cache
from dsv4bisect.run.events import Notice
from tests.run.test_run_units import SMOKE, _run, _saved_baseline

GOOD, BAD = "a" * 16, "b" * 16
LOOKS = TrialPolicy(hot=True, sequential=True)
# a bad end that loses every needle and copy answer the good end got right
LOSER = _run({f"{f}/L{n}/{i}": False for f in ("needle", "copy")
              for n in (256, 512, 1024, 2048) for i in range(3)})


class Probed(Exception):
    """An end the test expects to be probed (its engine asked for)."""


def _engine_for(*_args):
    raise Probed()


def _cache_run(tmp_path: Path, name: str) -> cache.CachedBaseline:
    key = cache.BaselineKey.of(GOOD, SMOKE)
    cache.store(key, *_saved_baseline(tmp_path / name))
    entry, _ = cache.lookup(key)
    assert entry is not None
    cand = LOSER.save(tmp_path / name / "candidate")
    candidate_cache.store(cache.BaselineKey.of(BAD, SMOKE), Path(str(cand.path)), entry)
    return entry


def _ends(tmp_path: Path, policy: TrialPolicy = LOOKS, use_cache: bool = True):
    events: list[Notice] = []
    probes = EndProbes(EndsBook(), None, spec=lambda: SMOKE, policy=policy, good={},  # type: ignore
                       good_fingerprint=GOOD, bad_fingerprint=BAD, use_cache=use_cache,
                       engine_for=_engine_for, on_event=events.append)
    trial_dir = tmp_path / "bisect" / "trials" / "001"
    return probes, TrialContext(SMOKE), trial_dir, events


def test_a_runs_ends_are_block_0s_settled_full_tier_ends(tmp_path) -> None:
    _cache_run(tmp_path, "run1")
    probes, ctx, trial_dir, events = _ends(tmp_path)
    ends, measured = probes.ends_for(ctx, trial_dir)
    assert not measured and ends.bad is not None and ends.from_run is not None
    assert ends.look == 2 and ctx.spec == SMOKE  # the full tier: the run's spec
    root = trial_dir.parent.parent / "ends" / "b0"
    assert json.loads((root / "settled.json").read_text()) == {"look": 2, "settled_by": None}
    assert (root / "look2" / "bad" / "run.json").is_file() and not (root / "look1").exists()
    assert any("ones a run measured" in e.text for e in events)
    verdict, run, requests = probes.cached_bad_end(ctx, ends, trial_dir)
    assert requests == 0 and verdict.verdict == "FAIL" and run.rows == ends.bad.rows
    assert ctx.looks["bad_end_cached"] is True and ctx.looks["end_look"] == 2


def test_full_ends_name_the_runs_ends_as_before(tmp_path) -> None:
    _cache_run(tmp_path, "run1")
    probes, ctx, trial_dir, _ = _ends(tmp_path, TrialPolicy(hot=True, sequential=True,
                                                            full_ends=True))
    ends, _ = probes.ends_for(ctx, trial_dir)
    assert ends.bad is not None
    assert (trial_dir.parent.parent / "ends" / "b0" / "bad" / "run.json").is_file()


def test_a_candidate_of_another_baseline_is_not_the_bad_end(tmp_path) -> None:
    _cache_run(tmp_path, "run1")
    cache.store(cache.BaselineKey.of(GOOD, SMOKE), *_saved_baseline(tmp_path / "run2"))
    probes, ctx, trial_dir, events = _ends(tmp_path)
    # the look-1 good end: the full tier's entry does not restrict (these runs are not the
    # smoke grid's cases), so it is measured, as before
    with pytest.raises(Probed):
        probes.ends_for(ctx, trial_dir)
    warned = [e.text for e in events if e.level == "warn"]
    assert any("judged against the baseline made" in w for w in warned), warned
    assert probes.book.block(0).bad is None and probes.book.block(0).from_run is None


def test_no_cache_probes_the_ends(tmp_path) -> None:
    _cache_run(tmp_path, "run1")
    probes, ctx, trial_dir, _ = _ends(tmp_path, use_cache=False)
    with pytest.raises(Probed):
        probes.ends_for(ctx, trial_dir)


# -- the plan: block 0's ends at no probe time where the cache holds them ----------------------
def test_cached_ends_cost_nothing_and_no_trial_pays_block_0s_good_end() -> None:
    from dsv4bisect.bisect.plan.costs import plan_costs, probe_shape
    from dsv4bisect.bisect.search.pricing import CostTracker

    everything = frozenset({"a", "b", "c"})
    made = "2026-12-06T13:55:00+00:00"
    cached = plan_costs("reference", probe_shape(SMOKE), given={}, ends_cached=made)
    plain = plan_costs("reference", probe_shape(SMOKE), given={})
    (line,) = [ln for ln in cached.lines if ln.name == "ends of seed block 0"]
    assert line.value == 0.0 and f"cached by a run at {made}" in line.source
    assert not [ln for ln in plain.lines if ln.name == "ends of seed block 0"]
    with_run, without = CostTracker(cached.costs, everything), CostTracker(plain.costs, everything)
    assert with_run.charge(frozenset(), 0.0) == 0.0 < without.charge(frozenset(), 0.0)
    assert with_run.charge(everything, 1.0) == 0.0 < without.charge(everything, 1.0)
    assert with_run.launches == 0
    # a trial between the ends: its engine and probe, never the good end's baseline
    fresh = CostTracker(cached.costs, everything)
    alone = fresh.charge(frozenset({"a"}), 0.5)
    assert 0 < alone < CostTracker(plain.costs, everything).charge(frozenset({"a"}), 0.5)
    # the bad end's re-test (seed block 1) measures its block's ends as before
    assert with_run.charge(everything, 1.0) > 0
    assert cached.costs.to_json()["ends0_cached"] is True
    assert "ends0_cached" not in plain.costs.to_json()


def test_the_runs_candidate_is_the_bad_end_with_its_inert_patches_on() -> None:
    # trtllm-clamp is inert on the embedded engine: the bisect leaves it out (at the good end's
    # state at both ends), the run's candidate has it on; its measurement is the bad end's
    from dsv4bisect.bisect.question import patch_overrides, resolve_question
    from dsv4bisect.bisect.setup import bad_end, run_bad_end
    from dsv4bisect.config.resolve import Overrides, resolve
    from dsv4bisect.run.ends import resolve_ends

    sets = ("patches.mma-decode.variant=swa-ring-stale",)
    q = resolve_question("reference-all", Overrides(sets=sets))
    assert [name for name, _ in q.left_out] == ["trtllm-clamp"]
    run = resolve_ends("reference-all", Overrides(sets=sets)).candidate
    assert bad_end(q).get("trtllm-clamp") != run_bad_end(q).get("trtllm-clamp") == "alpha"
    as_run = resolve("reference-all", patch_overrides(run_bad_end(q), tuple(q.sets)))
    assert as_run.fingerprint == run.fingerprint


def _hot_runner(events: list[Notice] | None = None, use_cache: bool = True):
    """The hot runner of `reference-all` with a fault at the smoke tier, and its question."""
    from dsv4bisect.bisect.question import resolve_question
    from dsv4bisect.bisect.setup import bad_end, run_bad_end
    from dsv4bisect.bisect.trials.hot_runner import HotEngineRunner
    from dsv4bisect.config.resolve import Overrides

    q = resolve_question("reference-all",
                         Overrides(sets=("patches.mma-decode.variant=swa-ring-stale",)))
    runner = HotEngineRunner(q.profile, q.good, bad_end(q), sets=tuple(q.sets),
                             run_bad=run_bad_end(q), use_cache=use_cache,
                             on_event=events.append if events is not None else lambda _e: None)
    assert runner.spec == SMOKE
    return runner, q


def _cache_runs_ends(runner, q, run_dir: Path) -> cache.CachedBaseline:
    """What a failing `run` of `q` leaves in the cache: its baseline, its candidate (LOSER)."""
    from dsv4bisect.bisect.setup import run_bad_end

    key = cache.BaselineKey.of(runner.good_cfg.fingerprint, SMOKE)
    cache.store(key, *_saved_baseline(run_dir))
    entry, _ = cache.lookup(key)
    assert entry is not None
    cand = LOSER.save(run_dir / "candidate")
    candidate_cache.store(cache.BaselineKey.of(runner.config(run_bad_end(q)).fingerprint, SMOKE),
                          Path(str(cand.path)), entry)
    return entry


def test_a_bad_end_started_ahead_sends_nothing_where_a_run_measured_it(tmp_path) -> None:
    from dsv4bisect.bisect.setup import bad_end

    runner, q = _hot_runner()
    _cache_runs_ends(runner, q, tmp_path / "run1")
    trial_dir = tmp_path / "bisect" / "trials" / "001"
    try:  # no engine is launched: the ends are the run's
        assert runner.ahead(bad_end(q), 0, trial_dir) == 0
        assert runner.engines_up == () and runner.launches == 0
    finally:
        runner.close()


def test_a_cached_good_end_alone_is_priced_as_read_from_the_cache(tmp_path) -> None:
    """An earlier bisect or `run` against the same good end left its baseline pair: block 0's
    good end is read from the cache (EndProbes.good_end), so `--plan` prices no A/A repeat for
    it; its end check still launches its engine and probes it once against the cached pair
    (HotEngineRunner `_probe`: a cached baseline is not this bisect's fresh measurement)."""
    from dsv4bisect.bisect.plan.costs import plan_costs, probe_shape
    from dsv4bisect.bisect.search.pricing import CostTracker
    from dsv4bisect.bisect.session import ask
    from dsv4bisect.bisect.setup import BisectRequest, prepare
    from dsv4bisect.config.resolve import Overrides

    request = BisectRequest(profile="reference-all", plan_only=True, overrides=Overrides(
        sets=("patches.mma-decode.variant=swa-ring-stale",)))
    before = prepare(ask(request), request)
    assert not before.setup().costs.good0_cached
    runner = before.engine
    assert runner is not None and runner.spec == SMOKE
    cache.store(cache.BaselineKey.of(runner.good_cfg.fingerprint, SMOKE),
                *_saved_baseline(tmp_path / "run1"))
    costs = prepare(ask(request), request).setup().costs
    assert costs.good0_cached and not costs.ends0_cached
    assert not prepare(ask(request), BisectRequest(
        profile="reference-all", plan_only=True, use_cache=False,
        overrides=request.overrides)).setup().costs.good0_cached  # --no-cache probes it
    from dsv4bisect.policy import Executor

    on_ray = BisectRequest(profile="reference-all", plan_only=True, executor=Executor.RAY,
                           overrides=request.overrides)
    # a cached good end alone does not travel to Ray nodes: priced as measured there
    assert not prepare(ask(on_ray), on_ray).setup().costs.good0_cached

    everything = frozenset({"a", "b"})
    made = "2026-12-06T16:30:00+00:00"
    good = plan_costs("sglang", probe_shape(SMOKE), given={}, good_cached=made,
                      load_time=("a",))
    plain = plan_costs("sglang", probe_shape(SMOKE), given={}, load_time=("a",))
    (line,) = [ln for ln in good.lines if ln.name == "good end of seed block 0"]
    assert line.value == 0.0 and made in line.source
    with_cache, without = CostTracker(good.costs, everything), CostTracker(plain.costs,
                                                                            everything)
    c = good.costs
    # the end check: a launch and one probe, the A/A repeat saved
    assert with_cache.charge(frozenset(), 0.0) == pytest.approx(c.launch_s + c.probe_s)
    assert without.charge(frozenset(), 0.0) == pytest.approx(
        c.launch_s + c.probe_s * (1 + c.aa_fraction))
    assert with_cache.launches == 1
    # the bad end: its own launch and probe, as without the cache
    assert with_cache.charge(everything, 1.0) == without.charge(everything, 1.0) > 0
    # a re-test of the good end (seed block 1) measures its block's baseline as before
    assert with_cache.charge(frozenset(), 0.0) == without.charge(frozenset(), 0.0)
    assert good.costs.to_json()["good0_cached"] is True


# -- on Ray: the driver sends them to every node (cluster/shared_ends.py `keep_run`) -----------
def test_the_ray_driver_keeps_a_runs_ends_as_block_0s_settled_ends_of_the_full_tier(
        tmp_path) -> None:
    from dsv4bisect.bisect.cluster import shared_ends as se

    events: list[Notice] = []
    runner, q = _hot_runner(events)
    entry = _cache_runs_ends(runner, q, tmp_path / "run1")
    driver = se.DriverEnds(tmp_path / "driver")
    names = ["b0/look2/baseline", "b0/look2/baseline-repeat", "b0/look2/bad"]
    assert se.seed_run_ends(driver, runner) == names
    index = driver.index()
    assert index is not None and index.good == runner.good_cfg.fingerprint
    assert index.settled == {0: (2, None)}  # the full tier: the run's spec
    run = index.from_run[0]
    assert run.source_run == str((tmp_path / "run1").resolve())
    assert run.baseline_made == entry.created_at and driver.from_run(0) == run
    assert set(index.ends) == set(names) and set(index.ends.values()) == {
        f"run {run.source_run}"}
    assert (driver.root / "b0" / "look2" / "bad" / "run.json").is_file()
    assert any("every node is sent them" in e.text for e in events)
    assert not [e for e in events if e.level == "warn"]
    # the archive a node gets names the run; a resumed driver keeps them once
    sent, archive = driver.pack()
    assert sent == set(names) and archive is not None
    assert se.unpack_ends(archive, tmp_path / "unpacked").from_run == {0: run}
    assert se.seed_run_ends(se.DriverEnds(tmp_path / "driver"), runner) == []
    runner.close()


def test_the_ray_driver_refuses_a_candidate_of_another_baseline_with_a_warning(tmp_path) -> None:
    from dsv4bisect.bisect.cluster import shared_ends as se

    events: list[Notice] = []
    runner, q = _hot_runner(events)
    _cache_runs_ends(runner, q, tmp_path / "run1")
    # the baseline measured again since (`run --no-cache`): the candidate was judged against
    # another entry, so the nodes measure block 0's ends as before
    cache.store(cache.BaselineKey.of(runner.good_cfg.fingerprint, SMOKE),
                *_saved_baseline(tmp_path / "run2"))
    driver = se.DriverEnds(tmp_path / "driver")
    assert se.seed_run_ends(driver, runner) == [] and driver.index() is None
    warned = [e.text for e in events if e.level == "warn"]
    assert any("judged against the baseline made" in w for w in warned), warned
    assert driver.from_run(0) is None
    # --no-cache looks nothing up
    plain, _ = _hot_runner(events, use_cache=False)
    assert se.seed_run_ends(driver, plain) == []
    for r in (runner, plain):
        r.close()


def test_a_node_without_the_cache_judges_block_0_by_the_runs_ends_the_driver_sent(
        tmp_path, monkeypatch) -> None:
    """The node side (remote_trial.run_on_node): a node whose own cache is empty adopts the
    driver's archive; its ∅ end check and its bad end's trial send no request and launch
    nothing, the bad end's being the cached run judged against the cached good end."""
    from dsv4bisect.bisect.cluster import shared_ends as se
    from dsv4bisect.bisect.setup import bad_end

    runner, q = _hot_runner()
    _cache_runs_ends(runner, q, tmp_path / "run1")
    driver = se.DriverEnds(tmp_path / "driver")
    assert se.seed_run_ends(driver, runner)
    _sent, archive = driver.pack()
    assert archive is not None
    monkeypatch.setenv("DSV4BISECT_CACHE", str(tmp_path / "node-cache"))  # another machine's
    node, _ = _hot_runner()
    assert node.run_cache() is None
    scratch = tmp_path / "node" / "bisect"
    try:
        assert len(se.adopt(node, archive, scratch / "adopted" / "t0")) == 3
        good = node.run(dict(q.good), 0, scratch / "trials" / "t0")
        bad = node.run(bad_end(q), 0, scratch / "trials" / "t1")
        assert node.launches == 0 and node.engines_up == ()
    finally:
        node.close()
        runner.close()
    source = str((tmp_path / "run1").resolve())
    assert good.requests == 0 and good.details["ends_from_run"] == source
    assert good.details["baseline_cached"] and good.aa_verdicts == ()
    assert bad.requests == 0 and bad.verdict == "FAIL"
    assert bad.details["bad_end_cached"] is True and bad.details["bad_end_from"] == source
    assert bad.details["end_look"] == 2 and bad.details["ends_measured"] == []
    assert bad.details["ends_from"]["bad"] == f"run {source}"


def test_the_runners_spec_is_the_one_its_end_probes_use() -> None:
    # a runner probes one spec: its trials and its ends' looks (a second copy in the end probes
    # once left a changed spec judging its trials against ends of the old one)
    runner, _ = _hot_runner()
    try:
        assert runner.look_spec(3, 2) == SMOKE.replace(seed_block=3)
        unfit = SMOKE.replace(turns=(64,))
        runner.spec = unfit
        assert runner.spec == unfit and runner.look_spec(3, 2) == unfit.replace(seed_block=3)
        assert runner.look_spec(3, 1).turns == (64,)
    finally:
        runner.close()
