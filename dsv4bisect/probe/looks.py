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
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.run import ProbeRun, RowKey, row_key
from dsv4bisect.probe.tasks import tasks_of

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
    order = {row_key({"case_id": c.case_id, "arm": arm, "concurrency": level}): i
             for i, (c, arm, level) in enumerate(tasks_of(later.spec, list(later.cases)))}
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
