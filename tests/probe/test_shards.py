"""A probe split across replicas (probe/shards.py): the seeded assignment of cases to shards and
the merge of the shards' runs into the run one node makes. Property tests over random probes,
shard counts, seeds and merge orders; the real probe on the embedded engine is in
test_shards_e2e.py."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.drift import DriftRecord
from dsv4bisect.probe.grid import Case, Cell
from dsv4bisect.probe.run import ProbeRun, row_key
from dsv4bisect.probe.shards import (
    Shard,
    assignment,
    case_work,
    merge,
    same_content,
    shard_cases,
    split_batch,
)
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.tasks import tasks_of

FAMILIES = ("needle", "copy", "drift")


def _spec(seed: int = 0, block: int = 0, levels: tuple[int, ...] = (1,),
          thinking: bool = False):
    base = tier_spec("ci")
    return replace(base, seed=seed, seed_block=block, concurrency=levels, thinking=thinking,
                   arms=("cold", "warm") if len(levels) > 1 else base.arms)


def _cases(lengths: list[int]) -> list[Case]:
    out = []
    for i, n in enumerate(lengths):
        family = FAMILIES[i % len(FAMILIES)]
        out.append(Case(f"{family}/L{n}/{i}", Cell(family, n, 0.5, 2), i, 1000 + i, n,
                        ({"role": "user", "content": f"case {i}"},), n, f"v{i}", (f"v{i}",),
                        0.5, 16))
    return out


def _whole_run(spec, cases: list[Case], rng: random.Random) -> ProbeRun:
    """What one node's probe of `cases` produces: a row per request in task order, a drift
    record per drift case (contents random: the merge must not care what they say)."""
    rows = []
    drift = []
    for case, arm, level in tasks_of(spec, cases):
        rows.append({"case_id": case.case_id, "family": case.family, "cell": case.cell.key,
                     "arm": arm, "concurrency": level, "prompt_tokens": case.prompt_tokens,
                     "correct": rng.random() < 0.5 if arm != "drift" else None,
                     "output": str(rng.random()), "latency_s": rng.random()})
        if arm == "drift":
            drift.append(DriftRecord(case.case_id, (1, 2, 3), 1, (1, 2), (-0.5, -0.25),
                                     (((1, -0.5),), ((2, -0.25),))))
    return ProbeRun(spec, "http://one", {"model": "m", "started_at": "t0"}, tuple(cases),
                    tuple(rows), tuple(drift), ("a note",), {"total_s": 9.0})


def _split(run: ProbeRun, count: int, rng: random.Random) -> list[ProbeRun]:
    """The shards' runs, as `collect(..., shard=Shard(i, count))` makes them: every case, only
    the shard's own requests (in the whole run's order), its own timing."""
    owner = assignment(run.spec, run.cases, count)
    out = []
    for i in range(count):
        rows = tuple({**r, "latency_s": rng.random()} for r in run.rows
                     if owner[r["case_id"]] == i)
        drift = tuple(d for d in run.drift if owner[d.case_id] == i)
        out.append(replace(run, url=f"http://node{i}", rows=rows, drift=drift,
                           timing={"total_s": rng.random()}, shard=Shard(i, count).to_dict(),
                           server={"model": "m", "started_at": f"t{i}"}))
    rng.shuffle(out)
    return out


probes = st.tuples(st.lists(st.sampled_from([256, 512, 1024, 4096, 16384]), min_size=1,
                            max_size=40),
                   st.integers(1, 6), st.integers(0, 2**31), st.integers(0, 3),
                   st.sampled_from([(1,), (1, 4)]), st.booleans())


@settings(max_examples=60, deadline=None)
@given(probes)
def test_the_shards_hold_every_case_once_by_the_seed(probe) -> None:
    lengths, count, seed, block, levels, thinking = probe
    spec, cases = _spec(seed, block, levels, thinking), _cases(lengths)
    owner = assignment(spec, cases, count)
    assert set(owner) == {c.case_id for c in cases}
    mine = [shard_cases(spec, cases, Shard(i, count)) for i in range(count)]
    assert set().union(*mine) == set(owner) and sum(map(len, mine)) == len(cases)
    # the same probe asks the same shards for the same cases, whatever the cases' order
    assert assignment(spec, list(reversed(cases)), count) == owner
    # balanced: no shard carries more than the average plus the largest case
    load = [sum(case_work(spec, c) for c in cases if owner[c.case_id] == i)
            for i in range(count)]
    largest = max(case_work(spec, c) for c in cases)
    assert max(load) <= sum(load) / count + largest


@settings(max_examples=60, deadline=None)
@given(probes, st.randoms(use_true_random=False))
def test_the_merge_of_the_shards_is_the_one_node_run(probe, rng) -> None:
    lengths, count, seed, block, levels, thinking = probe
    spec, cases = _spec(seed, block, levels, thinking), _cases(lengths)
    whole = _whole_run(spec, cases, rng)
    merged = merge(_split(whole, count, rng))
    assert same_content(merged, whole) == []
    assert [row_key(r) for r in merged.rows] == [row_key(r) for r in whole.rows]
    assert merged.drift == whole.drift and merged.notes == whole.notes
    # a replica caches other prompts than the one server did: the same answers, other hits
    hits = replace(merged, rows=tuple({**r, "cached_tokens": rng.randrange(64)}
                                      for r in merged.rows))
    assert same_content(hits, whole) == []
    wrong = replace(merged, rows=tuple({**r, "correct": not r["correct"]} if i == 0 else r
                                       for i, r in enumerate(merged.rows)))
    assert same_content(wrong, whole) == ["rows"]
    assert merged.shard is not None and merged.shard["count"] == count
    assert [p["index"] for p in merged.shard["parts"]] == list(range(count))
    assert merged.server["started_at"] == "t0"


def test_a_missing_repeated_or_foreign_shard_is_refused() -> None:
    rng = random.Random(1)
    spec, cases = _spec(), _cases([256, 512, 1024, 256, 4096, 512])
    shards = sorted(_split(_whole_run(spec, cases, rng), 3, rng), key=lambda r: r.shard["index"])
    with pytest.raises(ConfigError, match="not every shard"):
        merge(shards[:2])
    with pytest.raises(ConfigError, match="not every shard"):
        merge([shards[0], shards[0], shards[1], shards[2]])
    with pytest.raises(ConfigError, match="not a shard"):
        merge([replace(shards[0], shard=None), *shards[1:]])
    # a request counted twice: shard 1 also holds a row of shard 0's
    doubled = replace(shards[1], rows=shards[1].rows + shards[0].rows[:1])
    with pytest.raises(ConfigError, match="does not own"):
        merge([shards[0], doubled, shards[2]])
    with pytest.raises(ConfigError, match="is in two shards"):
        merge([replace(shards[0], rows=shards[0].rows * 2), shards[1], shards[2]])
    # shards that built other cases (another tokenizer) or ran another spec
    other = replace(shards[2], cases=tuple(replace(c, prompt_tokens=c.prompt_tokens + 1)
                                           for c in shards[2].cases))
    with pytest.raises(ConfigError, match="built other cases"):
        merge([shards[0], shards[1], other])
    with pytest.raises(ConfigError, match="different probe specs"):
        merge([shards[0], shards[1], replace(shards[2], spec=replace(spec, seed_block=1))])


def test_the_seed_block_moves_the_assignment() -> None:
    cases = _cases([512] * 30)
    assert assignment(_spec(block=0), cases, 3) != assignment(_spec(block=1), cases, 3)


@given(st.lists(st.integers(), max_size=50), st.integers(1, 8))
def test_a_sequential_batch_is_dealt_in_its_order(batch, count) -> None:
    parts = split_batch(batch, count)
    assert len(parts) == count and sorted(x for p in parts for x in p) == sorted(batch)
    # position p of the batch is the (p // count)-th request of shard p % count
    assert [parts[p % count][p // count] for p in range(len(batch))] == batch


def test_a_bad_shard_is_an_error() -> None:
    for index, count in ((0, 0), (3, 3), (-1, 2)):
        with pytest.raises(ConfigError):
            Shard(index, count)


def test_a_shard_survives_the_run_directory(tmp_path) -> None:
    rng = random.Random(2)
    spec, cases = _spec(), _cases([256, 512, 1024])
    shards = _split(_whole_run(spec, cases, rng), 2, rng)
    back = [ProbeRun.load(s.save(tmp_path / f"s{s.shard['index']}").path) for s in shards]
    assert [b.shard for b in back] == [s.shard for s in shards]
    merged = merge(back).save(tmp_path / "merged")
    again = ProbeRun.load(merged.path)
    assert again.shard == merged.shard and same_content(again, merged) == []
