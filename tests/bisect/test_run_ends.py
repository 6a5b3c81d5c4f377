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
    probes = EndProbes(EndsBook(), None, spec=SMOKE, policy=policy, good={},  # type: ignore
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
