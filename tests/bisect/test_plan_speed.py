"""`bisect --plan`'s speed-ups change no figure: the search memo replays exactly what the search
computes (bisect/plan/search_memo.py), and the microtest priors' cache gives back what the
microtest measured (bisect/priors_cache.py). Times are in docs/performance.md, not here."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from dsv4bisect.bisect import priors_cache
from dsv4bisect.bisect.microtest_priors import CandidatePrior, Coverage, MicrotestPriors
from dsv4bisect.bisect.plan.simulate import search_memo, simulate
from dsv4bisect.bisect.plan.whole_plan import Setup, common_draws
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.pricing import StepCosts

CANDIDATES = ("a", "b", "c", "d", "e")
HOT = StepCosts(launch_s=600, switch_s=90, probe_s=1200, aa_fraction=0.19, sequential=True,
                like_good_fraction=0.05, like_bad_fraction=0.03, hot=True, pool=1,
                load_time=frozenset({"a"}), paired=True)


@pytest.mark.parametrize("nodes", [1, 3])
@pytest.mark.parametrize("off", [(), ("hot",), ("priced",), ("sequential", "priors")])
def test_the_memo_gives_every_simulated_bisect_exactly_as_without_it(nodes, off) -> None:
    setup = Setup(CANDIDATES, Noise(0.1, 0.1), Noise(0.05, 0.02), HOT,
                  weights={"a": 2.0, "b": 0.5}, confirm=nodes == 1)
    cfg, priced = setup.without(off), "priced" not in off
    culprits, seeds = common_draws(setup, 60, 7)
    memo = search_memo(cfg, nodes, priced)
    plain = [simulate(cfg, nodes, c, random.Random(s), priced) for c, s in zip(culprits, seeds)]
    memoed = [simulate(cfg, nodes, c, random.Random(s), priced, memo)
              for c, s in zip(culprits, seeds)]
    assert memoed == plain
    assert 0 < memo.misses < sum(len(r.rounds) for r in plain)  # some histories were replayed


def test_a_memo_of_another_configuration_is_refused() -> None:
    setup = Setup(CANDIDATES, Noise(0.1, 0.1), Noise(0.05, 0.02), HOT)
    memo = search_memo(setup, 1, True)
    with pytest.raises(ValueError, match="another configuration"):
        simulate(replace(setup, confidence=0.99), 1, frozenset("a"), random.Random(0), True,
                 memo)


def _key(**change: object) -> str:
    args: dict[str, object] = {
        "candidates": ("mma-decode", "mhc-bf16"),
        "cover": {"mma-decode": Coverage(True), "mhc-bf16": Coverage(True)},
        "patches": {"mma-decode": "split-k", "mhc-bf16": "on"}, "checkpoint": "embedded",
        "moe_backend": "triton", "contexts": (256, 512)}
    args.update(change)
    return priors_cache.priors_key(**args)  # type: ignore[arg-type]


def test_the_priors_key_covers_what_the_priors_depend_on(tmp_path: Path) -> None:
    base = _key()
    assert base == _key()
    assert base != _key(patches={"mma-decode": "merge-no-rescale", "mhc-bf16": "on"})
    assert base != _key(contexts=(256, 512, 1024))
    assert base != _key(moe_backend="flashinfer_trtllm")
    assert base != _key(cover={"mma-decode": Coverage(True), "mhc-bf16": Coverage(False, "x")})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"one")
    first = _key(checkpoint=str(ckpt))
    (ckpt / "model.safetensors").write_bytes(b"other weights")  # another size
    assert _key(checkpoint=str(ckpt)) != first


def test_priors_round_trip_through_the_cache_and_a_damaged_entry_is_ignored() -> None:
    measured = MicrotestPriors(priors=(
        CandidatePrior("mma-decode", 16.0, "FAIL at 400x its tolerance", float("inf")),
        CandidatePrior("mhc-bf16", 0.5, "ok at 0.25x its tolerance", 0.25),
        CandidatePrior("trtllm-clamp", 1.0, "no microtest check", None)),
        seconds=3.25, checkpoint="embedded")
    key = _key()
    assert priors_cache.lookup(key) is None
    priors_cache.store(key, measured)
    got = priors_cache.lookup(key)
    assert got is not None and got.cached
    assert replace(got, cached="") == measured
    priors_cache.store(key, MicrotestPriors.disabled("off: never cached"))
    assert priors_cache.lookup(key) == got
    path = priors_cache.cache_root() / f"{key}.json"
    entry = json.loads(path.read_text())
    entry["priors"][0].pop("multiplier")
    path.write_text(json.dumps(entry))
    assert priors_cache.lookup(key) is None
    path.write_text("{not json")
    assert priors_cache.lookup(key) is None


def test_the_trial_plan_comes_back_from_the_cache_to_the_bit() -> None:
    from dsv4bisect.bisect.plan.trial_plan_cache import planned_trial
    from dsv4bisect.probe.sequential_plan import plan_trial
    from dsv4bisect.probe.spec import tier_spec

    spec = tier_spec("smoke")
    asked = {"loss_rate": 0.14, "sims": 40}
    direct = plan_trial(spec, 0.05, 0.05, **asked)
    assert planned_trial(spec, 0.05, 0.05, **asked) == direct  # simulated, then stored
    (entry,) = (priors_cache.cache_root().parent / "trial-plans").iterdir()
    assert planned_trial(spec, 0.05, 0.05, **asked) == direct  # read back
    entry.write_text("[1, 2")  # damaged: simulated again
    assert planned_trial(spec, 0.05, 0.05, **asked) == direct
    assert planned_trial(spec, 0.1, 0.05, **asked) != direct
    assert planned_trial(spec, 0.05, 0.05, loss_rate=0.3, sims=40) != direct
