"""A probe split across replicas: one configuration launched on several nodes, each probing a
share of the cases, merged into the run one node would have made (pure; docs/cluster.md,
"Sharded probes").

* **Assignment** (`assignment`): every case (with all its requests: every arm and concurrency
  level, its drift transcript) goes to exactly one shard, fixed by the probe's seed and seed
  block and the cases themselves: longest work first (prompt tokens of all the case's
  requests) to the least-loaded shard, ties broken by a seeded hash of the case id. So the
  union of the shards is exactly the cases one node runs, no request is in two shards, and a
  shard re-run elsewhere asks for the same requests.
* **Merge** (`merge`): the shards' rows and drift records in the order one node produces them,
  the cases (every shard builds them all from the same spec and tokenizer; the merge refuses
  shards whose cases differ), the notes once each. Timing and throughput are the shards'
  (wall time: the slowest shard's); everything else equals the unsharded run.
* **Sequential batches** (`split_batch`): a sequential trial's batch, in its own random order,
  dealt to the shards by unit (a request alone, or a concurrency group, which one shard sends
  whole so its batch mates stay together); the answers are observed in the batch's order, so
  the test decides exactly as on one node, and every shard stops when it does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.grid import Case
from dsv4bisect.probe.run import ProbeRun, RowKey, row_key
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.probe.stream import combine_latency

T = TypeVar("T")
_HINT = "probe every shard of one configuration with one spec, shard count and seed block"


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (0-based)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ConfigError(f"shard {self.index} of {self.count}",
                              "use 0 <= index < count, count >= 1")

    def to_dict(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Shard:
        return cls(int(data["index"]), int(data["count"]))


def case_work(spec: ProbeSpec, case: Case) -> int:
    """Prompt tokens of every request of `case` in a full probe (each arm at each concurrency
    level, the thinking arm, its drift transcript): the work its shard takes on."""
    from dsv4bisect.probe.tasks import tasks_of

    return sum(c.prompt_tokens for c, _, _ in tasks_of(spec, [case]))


def _tie(spec: ProbeSpec, case_id: str) -> bytes:
    return hashlib.sha256(f"shard:{spec.seed}:{spec.seed_block}:{case_id}".encode()).digest()


def assignment(spec: ProbeSpec, cases: Sequence[Case], count: int) -> dict[str, int]:
    """The shard of every case id (see the module docstring)."""
    Shard(0, count)  # validates count
    load = [0] * count
    out: dict[str, int] = {}
    for case in sorted(cases, key=lambda c: (-case_work(spec, c), _tie(spec, c.case_id))):
        if case.case_id in out:
            raise ConfigError(f"case {case.case_id} appears twice in the probe", _HINT)
        shard = min(range(count), key=lambda i: (load[i], i))
        out[case.case_id] = shard
        load[shard] += case_work(spec, case)
    return out


def shard_cases(spec: ProbeSpec, cases: Sequence[Case], shard: Shard) -> set[str]:
    """The case ids `shard` runs."""
    owner = assignment(spec, cases, shard.count)
    return {case_id for case_id, i in owner.items() if i == shard.index}


def split_batch(batch: Sequence[T], count: int) -> list[list[T]]:
    """A sequential trial's batch dealt to `count` shards in its order (shard i gets positions
    i, i + count, ...): every shard about as many items, none asked twice. An item is what
    must run on one server: the trial deals its units (a concurrency group is one item, never
    split across replicas)."""
    Shard(0, count)
    return [list(batch[i::count]) for i in range(count)]


def merge(runs: Sequence[ProbeRun]) -> ProbeRun:
    """One probe run from the runs of every shard of one probe (any order). Refuses a missing,
    repeated or foreign shard, shards with other cases or specs, and a request in two shards
    or in a shard that does not own its case."""
    from dsv4bisect.probe.tasks import request_keys

    if not runs:
        raise ConfigError("no shard to merge", _HINT)
    shards = [_shard_of(r) for r in runs]
    count = shards[0].count
    if sorted(s.index for s in shards) != list(range(count)) or any(
            s.count != count for s in shards):
        raise ConfigError(f"shards {sorted((s.index, s.count) for s in shards)} are not every "
                          f"shard of {count} once", _HINT)
    first = min(runs, key=lambda r: _shard_of(r).index)
    spec, cases = first.spec, first.cases
    for run in runs:
        if (run.spec.spec_hash(), run.spec.seed_block) != (spec.spec_hash(), spec.seed_block):
            raise ConfigError("the shards were probed with different probe specs", _HINT)
        if [c.to_dict() for c in run.cases] != [c.to_dict() for c in cases]:
            raise ConfigError(f"shard {_shard_of(run).index} built other cases than shard "
                              f"{_shard_of(first).index}",
                              "every shard must serve the same model, tokenizer and chat "
                              "template")
    owner = assignment(spec, cases, count)
    order = {key: i for i, key in enumerate(request_keys(spec, list(cases)))}
    rows: dict[RowKey, dict[str, Any]] = {}
    for run in runs:
        index = _shard_of(run).index
        for row in run.rows:
            key = row_key(row)
            if key not in order or owner.get(row["case_id"]) != index:
                raise ConfigError(f"shard {index} holds request {key}, which it does not own",
                                  _HINT)
            if key in rows:
                raise ConfigError(f"request {key} is in two shards", _HINT)
            rows[key] = row
    case_order = {c.case_id: i for i, c in enumerate(cases)}
    drift = sorted((d for r in runs for d in r.drift), key=lambda d: case_order[d.case_id])
    # each shard measured the null model on its own drift transcripts (probe/null.py), so the
    # merge holds every transcript's null scores once, in the case order
    null = sorted((n for r in runs for n in r.null), key=lambda n: (case_order[n[1].case_id],
                                                                     n[0], n[1].start))
    notes = tuple(dict.fromkeys(n for r in sorted(runs, key=lambda r: _shard_of(r).index)
                                for n in r.notes))
    parts = [{**_shard_of(r).to_dict(), "url": r.url,
              "started_at": r.server.get("started_at"), "timing": dict(r.timing),
              "rows": len(r.rows)} for r in sorted(runs, key=lambda r: _shard_of(r).index)]
    timing = {k: max(float(r.timing.get(k, 0.0)) for r in runs)
              for k in sorted({k for r in runs for k in r.timing})}
    starts = [str(r.server["started_at"]) for r in runs if r.server.get("started_at")]
    server = {**first.server, **({"started_at": min(starts)} if starts else {})}
    return replace(first, rows=tuple(sorted(rows.values(), key=lambda r: order[row_key(r)])),
                   drift=tuple(drift), null=tuple(null), notes=notes, timing=timing, server=server,
                   throughput=_throughput(runs), path=None,
                   shard={"count": count, "parts": parts})


def _shard_of(run: ProbeRun) -> Shard:
    if not run.shard or "index" not in run.shard:
        raise ConfigError(f"the probe run {run.path or run.url} is not a shard", _HINT)
    return Shard.from_dict(run.shard)


def _throughput(runs: Sequence[ProbeRun]) -> dict[str, Any]:
    """Per level: the shards' requests and tokens together over the slowest shard's wall."""
    out: dict[str, Any] = {}
    for level in sorted({k for r in runs for k in r.throughput}):
        parts = [r.throughput[level] for r in runs if level in r.throughput]
        requests = sum(int(p["requests"]) for p in parts)
        tokens = sum(int(p["tokens"]) for p in parts)
        wall = max(float(p["wall_s"]) for p in parts)
        out[level] = {"requests": requests, "tokens": tokens, "wall_s": wall,
                      "requests_per_s": round(requests / max(wall, 1e-9), 4),
                      "tokens_per_s": round(tokens / max(wall, 1e-9), 1),
                      "arms": sorted({a for p in parts for a in p.get("arms", [])}),
                      "shards": len(parts),
                      **combine_latency((p["ttft_s_mean"], int(p["ttft_n"]), p.get("itl_s_mean"),
                                         int(p.get("itl_n") or 0))
                                        for p in parts if p.get("ttft_n"))}
    return out


def same_content(a: ProbeRun, b: ProbeRun) -> list[str]:
    """What differs between two runs of the same probe, timing fields aside (latency, wall,
    throughput, start time, url, shard record) and the prefix cache's accounting: empty when
    equal."""
    # when the tokens came, not what; and how much of a prompt the server had cached, which
    # depends on what else it served (a replica serving half a concurrency level has half of
    # the level's prompts in its cache), not on what it answered
    timing = {"latency_s", "ttft_s", "itl_s", "itl_n", "cached_tokens"}
    diffs = []
    if a.spec != b.spec:
        diffs.append("spec")
    if [c.to_dict() for c in a.cases] != [c.to_dict() for c in b.cases]:
        diffs.append("cases")
    strip = [[{k: v for k, v in r.items() if k not in timing} for r in run.rows]
             for run in (a, b)]
    if strip[0] != strip[1]:
        diffs.append("rows")
    if [d.to_dict() for d in a.drift] != [d.to_dict() for d in b.drift]:
        diffs.append("drift")
    if sorted(a.notes) != sorted(b.notes):
        diffs.append("notes")
    return diffs
