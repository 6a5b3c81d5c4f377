"""The candidate cache (run/candidate_cache.py): a failing `run`'s candidate is a bisect's bad
end only beside the very baseline entry it was judged against."""

from __future__ import annotations

import json
from pathlib import Path

from dsv4bisect.run import baseline as cache
from dsv4bisect.run import candidate_cache
from tests.run.test_run_units import SMOKE, _run, _saved_baseline

GOOD, BAD = "a" * 16, "b" * 16


def _candidate(root: Path) -> Path:
    run = _run({"needle/L256/0": False}).save(root / "candidate")
    (root / "candidate" / "config.json").write_text("{}")
    return Path(str(run.path))


def test_a_candidate_judged_against_the_cached_baseline_is_found_beside_it(tmp_path) -> None:
    key, cand_key = cache.BaselineKey.of(GOOD, SMOKE), cache.BaselineKey.of(BAD, SMOKE)
    cache.store(key, *_saved_baseline(tmp_path / "run1"))
    base, _ = cache.lookup(key)
    assert base is not None and candidate_cache.lookup(cand_key, base) == (None, None)
    path = candidate_cache.store(cand_key, _candidate(tmp_path / "run1"), base)
    assert path.parent == cache.cache_root() and path.name.startswith("candidate-")
    meta = json.loads((path / "meta.json").read_text())
    assert meta["kind"] == "candidate" and meta["judged_against"]["created_at"] == base.created_at
    hit, why = candidate_cache.lookup(cand_key, base)
    assert hit is not None and why is None
    run = hit.install(tmp_path / "bisect" / "bad")
    assert run.rows == _run({"needle/L256/0": False}).rows
    assert not (tmp_path / "bisect" / "bad" / "config.json").exists()
    # a baseline entry is not a candidate's: the two keys never meet
    assert candidate_cache.lookup(key, base) == (None, None)


def test_a_candidate_of_another_baseline_or_a_damaged_one_is_refused(tmp_path) -> None:
    key, cand_key = cache.BaselineKey.of(GOOD, SMOKE), cache.BaselineKey.of(BAD, SMOKE)
    cache.store(key, *_saved_baseline(tmp_path / "run1"))
    first, _ = cache.lookup(key)
    assert first is not None
    candidate_cache.store(cand_key, _candidate(tmp_path / "run1"), first)
    # the baseline measured again (`--no-cache`) by another run: another entry
    cache.store(key, *_saved_baseline(tmp_path / "run2"))
    again, _ = cache.lookup(key)
    assert again is not None and again.source_run != first.source_run
    hit, why = candidate_cache.lookup(cand_key, again)
    assert hit is None and "judged against the baseline made" in str(why)
    hit, why = candidate_cache.lookup(cand_key, None)
    assert hit is None and "not cached" in str(why)
    assert candidate_cache.lookup(cand_key, first)[0] is not None
    entry = candidate_cache.entry_dir(cand_key)
    (entry / "candidate" / "rows.jsonl").write_text("{not json\n")
    hit, why = candidate_cache.lookup(cand_key, first)
    assert hit is None and "damaged" in str(why)
    other = cache.BaselineKey.of(BAD, SMOKE.replace(seed_block=1))
    assert candidate_cache.lookup(other, first) == (None, None)
