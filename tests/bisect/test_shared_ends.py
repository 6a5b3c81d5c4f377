"""Ends measured on one node serve every node (cluster/shared_ends.py, HotEngineRunner.adopt_ends):
the checks an adoption makes, and on the embedded engine a runner that adopts another runner's
ends and then probes a trial sequentially without measuring the good end, as a second Ray node
does, with the ends going through the driver's copy as files."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from dsv4bisect.bisect.cluster import shared_ends as se
from dsv4bisect.bisect.question import resolve_question
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.ends_book import end_name, write_settled
from dsv4bisect.bisect.trials.hot_runner import HOT_POLICY
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.cli.options import overrides
from dsv4bisect.errors import BisectError, ConfigError
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.run import ProbeRun

# a Ray node's policy with --full-ends (its names `b<block>/<end>`); with looks: the tests below
HOT = dataclasses.replace(HOT_POLICY, full_ends=True)

NODE = "gpu-03 (10.0.0.3, node 5e6f7a8b)"
N = re.escape(NODE)


def _runner(good: dict[str, str] | None = None, tier: str = "ci"):
    return node_runner(RunnerRequest("reference-all", good or {}, (), tier, False, policy=HOT))


def _run(runner, block: int) -> ProbeRun:
    """A probe run of `runner`'s spec at `block` (no request sent: adoption reads no rows)."""
    return ProbeRun(runner.spec.replace(seed_block=block), "http://127.0.0.1:1", {}, (), ())


def test_adoption_checks_the_seed_block_the_probe_spec_and_the_good_end() -> None:
    runner = _runner()
    good = runner.good_cfg.fingerprint
    ok = _run(runner, 1)
    with pytest.raises(ConfigError, match=f"seed block 1 from {N}.*probe of seed block 0"):
        runner.adopt_ends(1, _run(runner, 0), ok, None, good_fingerprint=good, source=NODE)
    other_tier = _runner(tier="smoke")
    with pytest.raises(ConfigError, match=f"the bad of seed block 1 from {N}.* spec"):
        runner.adopt_ends(1, None, None, _run(other_tier, 1), good_fingerprint=good,
                          source=NODE)
    with pytest.raises(ConfigError, match=f"from {N} were measured on good end"):
        runner.adopt_ends(1, ok, ok, None, good_fingerprint="f" * 32, source=NODE)
    with pytest.raises(ConfigError, match="baseline without its A/A repeat"):
        runner.adopt_ends(1, ok, None, None, good_fingerprint=good, source=NODE)
    # a valid adoption installs the pair, then the bad end; what the runner has stays
    assert runner.adopt_ends(1, ok, ok, None, good_fingerprint=good,
                             source=NODE) == ["b1/baseline", "b1/baseline-repeat"]
    assert runner.adopt_ends(1, ok, ok, _run(runner, 1), good_fingerprint=good,
                             source="another") == ["b1/bad"]
    assert runner.adopt_ends(1, ok, ok, _run(runner, 1), good_fingerprint=good,
                             source="a third") == []
    # a bad end whose block has no good end yet waits for it
    assert runner.adopt_ends(2, None, None, _run(runner, 2), good_fingerprint=good,
                             source=NODE) == ["b2/bad"]


def test_a_runner_with_looks_adopts_ends_of_either_look_and_a_bad_end_beside_its_own() -> None:
    """EndsBook.adopt where the ends are probed in two looks (bisect/end_looks.py): each run is
    checked against both looks' specs of its block; a bad end goes with the good end of its
    look. (Names with a look and the settled look: the tests below.)"""
    runner = node_runner(RunnerRequest("reference-all", {}, (), "smoke", False,
                                       policy=HOT_POLICY))
    good = runner.good_cfg.fingerprint

    def run(look: int, block: int = 0) -> ProbeRun:
        return ProbeRun(runner.look_spec(block, look), "http://127.0.0.1:1", {}, (), ())

    assert run(1).spec.spec_hash() != run(2).spec.spec_hash()
    assert runner.adopt_ends(0, run(1), run(1), None, good_fingerprint=good,
                             source=NODE) == ["b0/baseline", "b0/baseline-repeat"]
    with pytest.raises(ConfigError, match="bad end of seed block 0 .* look 2, this runner's "
                                          "good end of look 1"):
        runner.adopt_ends(0, None, None, run(2), good_fingerprint=good, source=NODE)
    assert runner.adopt_ends(0, None, None, run(1), good_fingerprint=good,
                             source=NODE) == ["b0/bad"]
    with pytest.raises(ConfigError, match="two looks"):
        runner.adopt_ends(1, run(1, 1), run(2, 1), None, good_fingerprint=good, source=NODE)
    half = ProbeRun(runner.look_spec(1, 2).replace(case_share=0.5), "http://127.0.0.1:1", {},
                    (), ())
    with pytest.raises(ConfigError, match="the bad of seed block 1 .* spec"):
        runner.adopt_ends(1, None, None, half, good_fingerprint=good, source=NODE)
    assert runner.adopt_ends(1, run(2, 1), run(2, 1), run(2, 1), good_fingerprint=good,
                             source=NODE) == ["b1/baseline", "b1/baseline-repeat", "b1/bad"]
    assert runner._ends.block(1).look == 2


def _looks_runner():
    return node_runner(RunnerRequest("reference-all", {}, (), "smoke", False, policy=HOT_POLICY))


def _look_run(runner, look: int, block: int = 0) -> ProbeRun:
    return ProbeRun(runner.look_spec(block, look), "http://127.0.0.1:1", {}, (), ())


@pytest.mark.parametrize("block, end, look", [(0, "baseline", None), (3, "bad", 1),
                                              (12, "baseline-repeat", 2), (0, "bad", 2)])
def test_an_ends_name_with_or_without_its_look_round_trips(block, end, look) -> None:
    name = end_name(block, end, look)
    assert se.parse_name(name) == (block, end, look)
    assert se.EndsIndex.from_json(se.EndsIndex("g", {name: NODE}, {block: (1, None)})
                                  .to_json()) == se.EndsIndex("g", {name: NODE}, {block: (1, None)})


@pytest.mark.parametrize("name", ["b0/look3/bad", "b0/look/bad", "b0/look1", "look1/b0/bad",
                                  "b0/look1/look1/bad", "b0/settled.json"])
def test_a_name_that_is_no_end_is_refused(name) -> None:
    with pytest.raises(BisectError, match="not an end of a seed block"):
        se.parse_name(name)


def test_the_settled_look_travels_node_to_driver_to_node_with_that_looks_ends_only(
        tmp_path: Path) -> None:
    """Seed block 0 settled at look 2 on node a: the driver keeps every end and the settled
    look, and sends another node the look-2 ends only, with the settled look; that node's own
    look-1 good end gives way, and its trials of the block use look 2's spec."""
    a, b = _looks_runner(), _looks_runner()
    good = a.good_cfg.fingerprint
    node_ends = tmp_path / "a" / "ends"
    look1 = [end_name(0, e, 1) for e in ("baseline", "baseline-repeat")]
    look2 = [end_name(0, e, 2) for e in ("baseline", "baseline-repeat", "bad")]
    for name in look1:
        _look_run(a, 1).save(node_ends / name)
    for name in look2:
        _look_run(a, 2).save(node_ends / name)
    driver = se.DriverEnds(tmp_path / "driver")
    assert driver.keep(se.pack_ends(node_ends, look1, good=good, node=NODE)) == sorted(look1)
    assert driver.index().settled == {}  # not settled yet: its bad end is not measured
    _sent, first = driver.pack()
    assert first is not None
    assert se.adopt(b, first, tmp_path / "b" / "in0") == look1  # the block's look-1 good end
    write_settled(node_ends, 0, 2, None)  # the bad end's trial: look 1 did not settle
    assert driver.keep(se.pack_ends(node_ends, look2, good=good, node=NODE)) == sorted(look2)
    assert driver.index().settled == {0: (2, None)}
    assert se.DriverEnds(tmp_path / "driver").index().settled == {0: (2, None)}  # a resume's
    sent, archive = driver.pack()
    assert sent == set(look2) and archive is not None  # look 1's ends are not sent again
    fresh = _looks_runner()
    assert se.adopt(fresh, archive, tmp_path / "c" / "in") == look2
    block = fresh._ends.block(0)
    assert block.look == 2 and block.known and block.bad is not None
    sent, archive = driver.pack(exclude=look1)
    assert sent == set(look2) and archive is not None
    assert se.adopt(b, archive, tmp_path / "b" / "in1") == look2
    ends = b._ends.block(0)
    assert ends.look == 2 and ends.baseline is not None and ends.bad is not None
    assert ends.baseline.spec.spec_hash() == b.look_spec(0, 2).spec_hash()
    assert ends.came_from == {"baseline": NODE, "baseline-repeat": NODE, "bad": NODE}


def test_a_block_settled_at_look_1_travels_with_its_bad_end_and_settled_by(tmp_path: Path
                                                                            ) -> None:
    a = _looks_runner()
    node_ends = tmp_path / "a" / "ends"
    names = [end_name(0, e, 1) for e in ("baseline", "baseline-repeat", "bad")]
    for name in names:
        _look_run(a, 1).save(node_ends / name)
    write_settled(node_ends, 0, 1, "accuracy")
    archive = se.pack_ends(node_ends, names, good=a.good_cfg.fingerprint, node=NODE)
    assert archive is not None
    other = _looks_runner()
    assert se.adopt(other, archive, tmp_path / "in") == names
    ends = other._ends.block(0)
    assert (ends.look, ends.settled_by) == (1, "accuracy")


def test_adoption_refuses_an_end_of_another_look_than_its_name_or_the_settled_look() -> None:
    runner = _looks_runner()
    good = runner.good_cfg.fingerprint
    one, two = _look_run(runner, 1), _look_run(runner, 2)
    # a run named look 1 whose spec is look 2's (and the reverse)
    with pytest.raises(ConfigError, match="baseline of seed block 0 look 1 from .* spec"):
        runner.adopt_ends(0, two, two, None, good_fingerprint=good, source=NODE, look=1)
    with pytest.raises(ConfigError, match="bad of seed block 0 look 2 from .* spec"):
        runner.adopt_ends(0, None, None, one, good_fingerprint=good, source=NODE, look=2)
    # ends of look 1 for a block that settled at look 2
    with pytest.raises(ConfigError, match="of look 1, the block settled at look 2"):
        runner.adopt_ends(0, one, one, None, good_fingerprint=good, source=NODE, look=1,
                          settled=(2, None))
    assert runner._ends.block(0).baseline is None  # nothing installed by a refusal
    # the right look is installed, under its name
    assert runner.adopt_ends(0, two, two, two, good_fingerprint=good, source=NODE, look=2,
                             settled=(2, None)) == [end_name(0, e, 2) for e in
                                                    ("baseline", "baseline-repeat", "bad")]


def test_a_spec_that_is_both_looks_is_look_1_unless_its_name_says_otherwise() -> None:
    """On the ci tier look 1 keeps every case: one spec, both looks. Unnamed (full ends'
    names) it is look 1, as a block measured here starts (9b16d70); named, the name's."""
    runner = node_runner(RunnerRequest("reference-all", {}, (), "ci", False, policy=HOT_POLICY))
    good = runner.good_cfg.fingerprint

    def run(block: int) -> ProbeRun:
        return _look_run(runner, 1, block)

    assert run(0).spec.spec_hash() == runner.look_spec(0, 2).spec_hash()
    assert runner.adopt_ends(0, run(0), run(0), None, good_fingerprint=good,
                             source=NODE) == ["b0/baseline", "b0/baseline-repeat"]
    assert runner._ends.block(0).look == 1
    assert runner.adopt_ends(1, run(1), run(1), None, good_fingerprint=good, source=NODE,
                             look=1) == ["b1/look1/baseline", "b1/look1/baseline-repeat"]
    assert runner._ends.block(1).look == 1
    assert runner.adopt_ends(2, None, None, run(2), good_fingerprint=good, source=NODE,
                             look=2, settled=(2, None)) == ["b2/look2/bad"]
    assert runner._ends.block(2).look == 2


def test_the_drivers_copy_keeps_the_first_of_each_end_and_sends_what_a_node_lacks(
        tmp_path: Path) -> None:
    runner = _runner()
    good = runner.good_cfg.fingerprint
    node_ends = tmp_path / "node" / "ends"
    for name in ("b0/baseline", "b0/baseline-repeat", "b0/bad"):
        _run(runner, 0).save(node_ends / name)
    driver = se.DriverEnds(tmp_path / "driver")
    assert driver.pack() == (frozenset(), None)
    first = se.pack_ends(node_ends, ["b0/baseline", "b0/baseline-repeat"], good=good, node=NODE)
    assert driver.keep(first) == ["b0/baseline", "b0/baseline-repeat"]
    again = se.pack_ends(node_ends, ["b0/baseline", "b0/bad"], good=good, node="other")
    assert driver.keep(again) == ["b0/bad"]  # its baseline: the driver has one already
    assert driver.index() == se.EndsIndex(good, {"b0/baseline": NODE,
                                                 "b0/baseline-repeat": NODE, "b0/bad": "other"})
    sent, archive = driver.pack(exclude={"b0/baseline", "b0/baseline-repeat"})
    assert sent == {"b0/bad"} and archive is not None
    other = _runner()
    assert se.adopt(other, archive, tmp_path / "in") == ["b0/bad"]  # waits for its good end
    with pytest.raises(BisectError, match="good end"):
        driver.keep(se.pack_ends(node_ends, ["b0/bad"], good="e" * 32, node="x"))
    # a resume's driver reads the same copy
    kept = se.DriverEnds(tmp_path / "driver").index()
    assert kept is not None and set(kept.ends) == {"b0/baseline", "b0/baseline-repeat", "b0/bad"}


@pytest.mark.e2e
@pytest.mark.timeout(900)
# two launches, three ci-tier probes and a sequential one: about 30 s on the 2-core CPU
def test_a_runner_with_adopted_ends_probes_sequentially_and_measures_no_good_end(
        tmp_path: Path) -> None:
    q = resolve_question("reference-all", overrides(None, None, None, ["engine.precision=exact",
                                                        "patches.hash-topk-scaling.variant=double-scale"]),
                         None, None, "hash-topk-scaling,mhc-bf16")
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)

    def runner():
        return node_runner(RunnerRequest(q.profile, q.good, tuple(q.sets), "ci", False,
                                         bad=spec.patches_for(frozenset(q.candidates)),
                                         load_time=tuple(q.load_time), policy=HOT))

    first, second = runner(), runner()
    driver = se.DriverEnds(tmp_path / "driver")

    def trial(r, subset: set[str], node: str, n: int):
        trial_dir = tmp_path / node / "bisect" / "trials" / f"t{n}"
        trial_dir.mkdir(parents=True)
        _sent, archive = driver.pack()
        if archive is not None:
            se.adopt(r, archive, tmp_path / node / "bisect" / "adopted" / f"t{n}")
        result = r.run(spec.patches_for(frozenset(subset)), 0, trial_dir)
        names = result.details["ends_measured"]
        if names:
            driver.keep(se.pack_ends(r.ends_dir(trial_dir), names, good=r.good_cfg.fingerprint,
                                     node=node))
        return result

    try:
        good = trial(first, set(), "node-a", 0)  # the good end: baseline + A/A, a launch
        bad = trial(first, set(q.candidates), "node-a", 1)  # the bad end: full size
        one = trial(second, {"hash-topk-scaling"}, "node-b", 2)  # adopted: sequential
        empty = trial(second, set(), "node-b", 3)  # the ∅ check of an adopted block
    finally:
        for r in (first, second):
            r.close()
            r.stop_all()
    assert good.details["ends_measured"] == ["b0/baseline", "b0/baseline-repeat"]
    assert len(good.aa_verdicts) == 1
    assert bad.details["ends_measured"] == ["b0/bad"] and bad.error_rates is None
    # node b measured no end, judged against node a's, with the sequential trial probe
    assert one.details["ends_measured"] == []
    assert one.details["ends_from"] == {"bad": "node-a", "baseline": "node-a",
                                        "baseline-repeat": "node-a"}
    assert one.error_rates is not None and one.details["baseline_cached"]
    assert 0 < one.requests < bad.requests
    assert one.aa_verdicts == ()
    assert one.verdict in (V.FAIL, V.WARN)  # hash-topk-scaling is the culprit
    # its ∅ check is node a's A/A verdict: no launch, no request, no A/A reported again
    assert empty.verdict is good.verdict and empty.aa_verdicts == ()
    assert empty.requests == 0 and second.launches == 1


def test_ends_of_another_good_end_sent_to_a_node_are_its_error_naming_it(tmp_path: Path) -> None:
    """The node side of a trial request (remote_trial.run_on_node): the ends are installed
    before anything launches, and a mismatch comes back as the node's one-line error."""
    from dsv4bisect.bisect.cluster import remote_trial as rt

    runner = _runner()
    other = _runner({"hash-topk-scaling": "double-scale"})  # another good end
    ends = tmp_path / "elsewhere" / "ends"
    for name in ("b0/baseline", "b0/baseline-repeat"):
        _run(other, 0).save(ends / name)
    archive = se.pack_ends(ends, ["b0/baseline", "b0/baseline-repeat"],
                           good=other.good_cfg.fingerprint, node="gpu-01")
    cfg = runner.config({})
    trial = rt.NodeTrial({}, 0, cfg.fingerprint, cfg.identity, runner.probe_hash, "bisect", "t0")
    reply = rt.run_on_node(runner, trial, tmp_path / "scratch", {"name": NODE}, archive)
    with pytest.raises(ConfigError) as raised:
        rt.receive(reply, tmp_path / "driver" / "trials" / "t0", NODE)
    assert raised.value.message.startswith(f"node {NODE}: the ends of seed block 0 from gpu-01 "
                                           "were measured on good end ")
    assert runner.launches == 0
