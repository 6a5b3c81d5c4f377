"""A candidate's probe in two parts, so that it can start before the good end's run exists
(docs/cluster.md, "Sharded rows": the two ends at once).

A candidate's probe replays the good end's run: its cases and its drift transcripts. Only the
drift transcripts need that run: the cases are built from the probe spec, the seed and the
server's tokenizer (deterministic), and every accuracy request is scored against its case's
expected answer. So:

* `collect_ahead(url, spec)` builds the cases itself and sends every accuracy request (each
  arm at each concurrency level, the thinking arm), in the order and at the levels of the
  whole run — what `collect(url, spec, reference_run=good)` sends before its drift scoring;
* `finish_ahead(url, ahead, good)` checks that the cases it built are the good end's, one for
  one, then scores the good end's drift transcripts, and returns the run `collect` would have
  made: the same rows in the same order, the same drift records and notes (timing aside;
  tested at `precision: exact`).

Both take a shard (probe/shards.py): a shard's ahead part is finished on the same replica,
and the finished shards merge like any others. The drift scoring is a small share of a probe
(one prefill per drift case, no decode: 0.8 % of the standard tier's prompt tokens), so the
ahead part is nearly all of it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import (Progress, _build, _run_cases, _server_dict, check_same_spec,
                                     open_client)
from dsv4bisect.probe.shards import Shard, merge, shard_cases
from dsv4bisect.probe.spec import ProbeSpec

AHEAD = "ahead"  # ProbeRun.timing key: the seconds of the ahead part (the rest: the finish)


class OtherCases(ConfigError):
    """The candidate built other cases than the good end's run (another tokenizer or chat
    template, or a server reporting other compress ratios): its probe must replay the good
    end's cases from the start."""


def collect_ahead(url: str, spec: ProbeSpec, *, api_key: str | None = None,
                  on_progress: Progress | None = None, model: str | None = None,
                  shard: Shard | None = None) -> ProbeRun:
    """Every accuracy request of a candidate's probe (`shard`: of that shard's cases), on
    cases built here; no drift scoring. The notes of the build (what the server did not
    report) are left out: a run that replays the good end's cases has none of them."""
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    client = open_client(url, spec, api_key, model)
    try:
        server = client.describe()
        cases = _build(client, spec, server, [], on_progress)
        t_build = time.perf_counter() - t0
        notes: list[str] = []
        mine = None if shard is None else shard_cases(spec, cases, shard)
        rows, _, throughput = _run_cases(client, spec, cases, None, notes, on_progress, mine,
                                         part="accuracy")
    finally:
        client.close()
    timing = {"build_s": round(t_build, 3), AHEAD: round(time.perf_counter() - t0, 3)}
    return ProbeRun(spec, url, {**_server_dict(server), "started_at": started}, tuple(cases),
                    tuple(rows), (), tuple(notes), timing, throughput=throughput,
                    shard=None if shard is None else shard.to_dict())


def finish_ahead(url: str, ahead: ProbeRun, reference_run: ProbeRun, *,
                 api_key: str | None = None, on_progress: Progress | None = None,
                 model: str | None = None) -> ProbeRun:
    """`ahead` (collect_ahead's run, on this `url`'s engine) finished against the good end's
    run: its drift transcripts scored here. The run `collect(url, spec, reference_run=
    reference_run)` makes (for `ahead`'s shard). Other cases than the good end's: `OtherCases`."""
    spec = ahead.spec
    check_same_spec(spec, reference_run.spec)
    if [c.to_dict() for c in ahead.cases] != [c.to_dict() for c in reference_run.cases]:
        raise OtherCases("the candidate built other probe cases than the good end's run",
                         "baseline and candidate must serve the same tokenizer and chat "
                         "template")
    t0 = time.perf_counter()
    shard = Shard.from_dict(ahead.shard) if ahead.shard else None
    cases = list(reference_run.cases)
    mine = None if shard is None else shard_cases(spec, cases, shard)
    notes = list(ahead.notes)
    client = open_client(url, spec, api_key, model)
    try:
        rows, drift, _ = _run_cases(client, spec, cases, reference_run, notes, on_progress,
                                    mine, part="drift")
    finally:
        client.close()
    total = float(ahead.timing.get(AHEAD, 0.0)) + time.perf_counter() - t0
    timing = {**ahead.timing, "total_s": round(total, 3)}
    # drift rows are the run's last requests (tasks.tasks_of): after every accuracy row
    return replace(ahead, url=url, cases=tuple(cases), rows=tuple(ahead.rows) + tuple(rows),
                   drift=tuple(drift), notes=tuple(notes), timing=timing, path=None)


def collect_ahead_sharded(urls: Sequence[str], spec: ProbeSpec, *, api_key: str | None = None,
                          on_progress: Progress | None = None, model: str | None = None
                          ) -> list[ProbeRun]:
    """`collect_ahead` split across replicas (shard i on `urls[i]`, all at once), as
    runner.collect_sharded splits `collect`: a replica that fails has its shard re-run, whole,
    on `urls[0]` (the caller's own engine) afterwards; a failure of `urls[0]` is raised. The
    shards' runs, by shard (each then finished where it ran: `finish_ahead_sharded`)."""
    count = len(urls)

    def one(i: int, url: str) -> ProbeRun:
        return collect_ahead(url, spec, api_key=api_key, model=model, shard=Shard(i, count),
                             on_progress=on_progress if url == urls[0] else None)

    return _each(urls, one)


def finish_ahead_sharded(urls: Sequence[str], aheads: Sequence[ProbeRun],
                         reference_run: ProbeRun, *, api_key: str | None = None,
                         on_progress: Progress | None = None, model: str | None = None
                         ) -> ProbeRun:
    """Each shard of `aheads` finished on the url it ran on (`aheads[i].url`, else `urls[0]`
    where that replica is gone), merged into the one-node run (probe/shards.py)."""
    def one(i: int, url: str) -> ProbeRun:
        return finish_ahead(url, aheads[i], reference_run, api_key=api_key, model=model,
                            on_progress=on_progress if url == urls[0] else None)

    return merge(_each([a.url for a in aheads], one, home=urls[0]))


def _each(urls: Sequence[str], one: object, home: str | None = None) -> list[ProbeRun]:
    """`one(i, urls[i])` for every i at once; a failure on a url other than `home` (default
    `urls[0]`) is re-run on `home` afterwards (the same requests: the shard is the seed's)."""
    home = urls[0] if home is None else home
    run = one  # type: ignore[assignment]
    with ThreadPoolExecutor(len(urls)) as pool:
        futures = [pool.submit(run, i, u) for i, u in enumerate(urls)]  # type: ignore[arg-type]
        out: list[ProbeRun | None] = []
        for url, future in zip(urls, futures):
            try:
                out.append(future.result())
            except OtherCases:
                raise
            except Exception:
                if url == home:
                    raise
                out.append(None)
    return [r if r is not None else run(i, home)  # type: ignore[operator]
            for i, r in enumerate(out)]
