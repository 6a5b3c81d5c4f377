"""The polluting phase (`warmup_requests`): where it comes from, what it sends, what it costs,
and that the verdict says so (probe/warmup.py; a late fault it catches: tests/reference/
test_pd_e2e.py)."""

from __future__ import annotations

from dsv4bisect.bisect.plan.costs import plan_costs, probe_shape
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.probe.grid import build_cases
from dsv4bisect.probe.layout import calibrate
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import judge
from dsv4bisect.probe.spec import LATE_REQUESTS, tier_spec
from dsv4bisect.probe.vocab import PROBE_VOCAB
from dsv4bisect.probe.warmup import pollution_spec
from dsv4bisect.run.ends import probe_spec


def test_the_long_tiers_pollute_by_default_and_the_short_ones_keep_their_hash() -> None:
    assert [tier_spec(t).warmup_requests for t in ("ci", "smoke", "standard", "deep")] == [
        0, 0, LATE_REQUESTS, LATE_REQUESTS]
    smoke = tier_spec("smoke")
    assert "warmup_requests" not in smoke.canonical()  # cached smoke baselines stay valid
    assert smoke.replace(warmup_requests=8).spec_hash() != smoke.spec_hash()
    cfg = resolve("reference", Overrides(sets=("probe.warmup_requests=12",)))
    assert probe_spec(cfg).warmup_requests == 12
    assert probe_spec(resolve("reference"), tier="standard").warmup_requests == LATE_REQUESTS


def test_polluting_conversations_are_other_cases_at_the_shortest_length() -> None:
    spec = tier_spec("smoke").replace(warmup_requests=20)
    source = pollution_spec(spec)
    assert source.lengths == (256,) and source.seed != spec.seed
    assert source.warmup_requests == 0 and set(source.families) == {"needle", "copy",
                                                                     "vartrack"}
    count = lambda messages: sum(len(m["content"]) for m in messages)  # noqa: E731
    calib = calibrate(count, PROBE_VOCAB)
    text = lambda case: repr(case.messages)  # noqa: E731
    measured = {text(c) for c in build_cases(spec, PROBE_VOCAB, count, calib, (4, 16, 32),
                                             lengths=(256,))}
    polluting = build_cases(source, PROBE_VOCAB, count, calib, (4, 16, 32))
    assert len(polluting) >= 20 and not measured & {text(c) for c in polluting}


def test_the_polluting_phase_is_priced() -> None:
    shape = probe_shape(tier_spec("standard"))
    assert (shape.warmup_requests, shape.warmup_tokens) == (LATE_REQUESTS, LATE_REQUESTS * 4096)
    without = plan_costs("sglang", probe_shape(tier_spec("standard").replace(warmup_requests=0)),
                         given={})
    with_it = plan_costs("sglang", shape, given={})
    assert with_it.costs.probe_s > without.costs.probe_s
    line = next(x for x in with_it.lines if x.name.startswith("full probe"))
    assert "polluting phase of 256 requests" in line.source
    ref = plan_costs("reference", probe_shape(tier_spec("smoke").replace(warmup_requests=40)),
                     given={})
    assert ref.costs.probe_s > plan_costs("reference", probe_shape(tier_spec("smoke")),
                                          given={}).costs.probe_s


def test_the_verdict_says_the_servers_were_polluted_first() -> None:
    rows = [{"case_id": f"needle/c/{i}", "family": "needle", "cell": "needle/c", "arm": "cold",
             "seed": i, "correct": True, "signatures": [], "prompt_tokens": 100,
             "length": 256, "depth": 0.5, "turns": 3} for i in range(20)]
    for spec, said in ((tier_spec("smoke").replace(warmup_requests=30), True),
                       (tier_spec("smoke"), False)):
        run = ProbeRun(spec, "http://x", {}, (), tuple(rows), ())
        v = judge(run, run, run)
        assert v.probe["warmup_requests"] == spec.warmup_requests
        assert any("polluting phase of 30 requests" in r for r in v.reasons) is said
