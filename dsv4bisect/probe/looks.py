"""A later look of a probe, completed from an earlier one: the run of the full grid whose cases
an earlier, smaller look already probed (pure; bisect/end_looks.py, docs/bisect.md "Ends that stop
when their question is answered").

A bisect's ends are probed in looks: look 1 keeps part of the accuracy cases and every drift
transcript, and where it does not settle the ends, look 2 is the full tier. Every look-1 case is
a case of the full tier byte for byte (probe/grid.py `kept_case_ids`), so look 2 sends only the
requests of the cases look 1 did not keep (`collect(..., skip=...)`), and `extend` adds look 1's
own requests, drift records and null model: the run one probe of the full tier makes, with the
evidence a group-sequential test accumulates (look 2's answers are look 1's and the new ones).
The rows come in the order an unsharded full probe sends them, so every comparison stays paired
by (case, arm, concurrency) as before.

`restrict` goes the other way: the run of the full tier cut to the cases a look keeps (a full-tier
baseline a failing `run` cached, served as the bisect's look-1 good end; bisect/trials/
end_probes.py). A case's requests depend on the spec's arms and levels and on the case alone
(probe/tasks.py), which both looks share, so the cut holds exactly the requests a probe of the
look sends; only their batch mates at a level above 1 were others.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.grid import kept_case_ids
from dsv4bisect.probe.run import ProbeRun, RowKey, row_key
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.probe.tasks import request_keys

_RESTRICT_HINT = "restrict a run of the full tier at the look's seed and seed block"
_HINT = "complete a look with the earlier look of the same ends (same spec seed and seed block)"


def earlier_cases(earlier: ProbeRun) -> frozenset[str]:
    """The case ids an earlier look probed: what the later look skips."""
    return frozenset(c.case_id for c in earlier.cases)


def extend(earlier: ProbeRun, later: ProbeRun) -> ProbeRun:
    """`later` (the full grid, probed with `skip=earlier_cases(earlier)`) with `earlier`'s
    requests added. Refuses an earlier look whose cases are not the later one's, byte for byte,
    or a request both runs hold."""
    if (earlier.spec.seed, earlier.spec.seed_block) != (later.spec.seed, later.spec.seed_block):
        raise ConfigError("the earlier look was probed with another seed or seed block", _HINT)
    built = {c.case_id: c.to_dict() for c in later.cases}
    for case in earlier.cases:
        if built.get(case.case_id) != case.to_dict():
            raise ConfigError(f"case {case.case_id} of the earlier look is not the later look's",
                              _HINT)
    order = {key: i for i, key in enumerate(request_keys(later.spec, list(later.cases)))}
    rows: dict[RowKey, dict[str, Any]] = {row_key(r): r for r in later.rows}
    for row in earlier.rows:
        key = row_key(row)
        if key in rows:
            raise ConfigError(f"request {key} is in both looks", _HINT)
        if key not in order:
            raise ConfigError(f"request {key} of the earlier look is not a request of the "
                              "later one", _HINT)
        rows[key] = row
    case_order = {c.case_id: i for i, c in enumerate(later.cases)}
    drift = sorted((*earlier.drift, *later.drift), key=lambda d: case_order[d.case_id])
    null = sorted((*earlier.null, *later.null),
                  key=lambda n: (case_order[n[1].case_id], n[0], n[1].start))
    n_earlier = len(earlier.rows)
    notes = (*dict.fromkeys((*earlier.notes, *later.notes)),
             f"look: {n_earlier} of {len(rows)} requests ({len(earlier.cases)} cases) were "
             f"probed in the earlier look ({earlier.path or earlier.url}), the rest now")
    timing = {k: round(float(earlier.timing.get(k, 0.0)) + float(later.timing.get(k, 0.0)), 3)
              for k in sorted({*earlier.timing, *later.timing})}
    return replace(later, rows=tuple(sorted(rows.values(), key=lambda r: order[row_key(r)])),
                   drift=tuple(drift), null=tuple(null), notes=notes, timing=timing,
                   throughput=_throughput(earlier, later), path=None)


def restrict(run: ProbeRun, spec: ProbeSpec, *, whole: bool = True) -> ProbeRun:
    """`run` (a probe of the full tier) cut to the cases `spec` (a look of it) keeps: their
    requests, drift records and null model (drift cases are always kept), as `spec`'s run.
    `whole`: the run holds every case the look keeps (an A/A repeat covers a subset of them:
    False). Refuses a run of another seed or seed block, or one that lacks a kept case (with
    `whole`) or a request of a kept case."""
    if (run.spec.seed, run.spec.seed_block) != (spec.seed, spec.seed_block):
        raise ConfigError("the run to restrict was probed with another seed or seed block",
                          _RESTRICT_HINT)
    if run.spec.replace(case_share=spec.case_share).spec_hash() != spec.spec_hash():
        raise ConfigError("the run to restrict is of another probe spec than the look's",
                          _RESTRICT_HINT)
    kept = kept_case_ids(spec)
    cases = tuple(c for c in run.cases if c.family == "drift" or kept is None
                  or c.case_id in kept)
    missing = sorted((kept or frozenset()) - {c.case_id for c in cases})
    if whole and missing:
        raise ConfigError(f"the run to restrict lacks case {missing[0]} of the look "
                          f"({len(missing)} missing)", _RESTRICT_HINT)
    have = run.rows_by_key()
    want = request_keys(spec, list(cases))
    lost, wanted = [k for k in want if k not in have], set(want)
    if lost:
        raise ConfigError(f"the run to restrict lacks request {lost[0]} of a kept case "
                          f"({len(lost)} missing)", _RESTRICT_HINT)
    ids = {c.case_id for c in cases}
    note = (f"look: {len(want)} of {len(run.rows)} requests ({len(cases)} of {len(run.cases)} "
            f"cases) of the full tier's run ({run.path or run.url}); its timing and throughput "
            "are that run's")
    return replace(run, spec=spec, cases=cases,
                   rows=tuple(r for r in run.rows if row_key(r) in wanted),
                   drift=tuple(d for d in run.drift if d.case_id in ids),
                   null=tuple(n for n in run.null if n[1].case_id in ids),
                   notes=(*run.notes, note), path=None)


def _throughput(earlier: ProbeRun, later: ProbeRun) -> dict[str, Any]:
    """Per level: both looks' requests and tokens over their walls added (they ran one after
    the other); latency figures are the later look's where it sent any, else the earlier's."""
    out: dict[str, Any] = {}
    for level in sorted({*earlier.throughput, *later.throughput}):
        parts = [r.throughput[level] for r in (earlier, later) if level in r.throughput]
        requests = sum(int(p["requests"]) for p in parts)
        tokens = sum(int(p["tokens"]) for p in parts)
        wall = sum(float(p["wall_s"]) for p in parts)
        out[level] = {**parts[-1], "requests": requests, "tokens": tokens,
                      "wall_s": round(wall, 3),
                      "requests_per_s": round(requests / max(wall, 1e-9), 4),
                      "tokens_per_s": round(tokens / max(wall, 1e-9), 1)}
    return out
