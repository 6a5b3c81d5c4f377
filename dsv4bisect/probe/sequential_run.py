"""Run a sequential trial probe on a live server (the I/O around probe/sequential.py).

Given the good end's baseline `ProbeRun` (its cases are replayed byte for byte), the bad end's
run and the A/A repeat, `run_sequential` scores every drift transcript, then sends the accuracy
requests the test draws, batch by batch, until it decides. Requests go through the fixed probe's
own `chat_row` / `drift_row`; infrastructure errors raise `ProbeError` as the probe does. The
rows it collected form a `ProbeRun` (saved with `save`, in the fixed probe's format) so reports
can show them; `sequential.json` beside it holds the decision.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from dsv4bisect.base.atomic import write_json
from dsv4bisect.errors import ConfigError
from dsv4bisect.policy import DEFAULT_POLICY, TrialPolicy
from dsv4bisect.probe.client import ProbeClient
from dsv4bisect.probe.drift import non_finite_cases
from dsv4bisect.probe.judge import drift_check
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import (
    DriftUnsupported,
    chat_row,
    drift_row,
    group_rows,
    warmup_phase,
)
from dsv4bisect.probe.sequential import (
    DEFAULT_BATCH,
    Decision,
    DriftFigures,
    EndCase,
    SequentialTrial,
    ends_from_runs,
)
from dsv4bisect.probe.shards import split_batch
from dsv4bisect.probe.verdict import Verdict

SEQUENTIAL_SCHEMA = "dsv4bisect.sequential-trial/1"
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class SequentialResult:
    """The decision and the rows it came from."""

    decision: Decision
    run: ProbeRun  # the trial's rows: every drift transcript, the accuracy requests drawn
    seed: int
    notes: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        return self.decision.verdict

    def to_json(self) -> dict[str, Any]:
        return {"schema": SEQUENTIAL_SCHEMA, **self.decision.to_dict(), "seed": self.seed,
                "notes": list(self.notes), "probe": {"tier": self.run.spec.tier,
                                                     "spec_hash": self.run.spec.spec_hash(),
                                                     "seed_block": self.run.spec.seed_block},
                "run": self.run.path}

    def as_verdict(self) -> Verdict:
        """The decision as a probe verdict (what verdict.json and the bisect's ledger keep): its
        reasons, its drift figures and, under `overall`, the whole decision (requests, error
        rates, LLR)."""
        d, spec = self.decision, self.run.spec
        drift = d.drift.to_dict() if d.drift else {}
        return Verdict(d.verdict, tuple(d.reasons),
                       {"tier": spec.tier, "spec_hash": spec.spec_hash(),
                        "seed_block": spec.seed_block, "sequential": True},
                       overall={"sequential": d.to_dict()},
                       drift={"status": drift.get("status"), "trigger": drift},
                       error_rates=(d.false_fail, d.false_pass), decided_by=d.decided_by)

    def save(self, directory: str | os.PathLike[str]) -> SequentialResult:
        """The rows as a probe run directory, plus `sequential.json`."""
        saved = self.run.save(directory)
        out = SequentialResult(self.decision, saved, self.seed, self.notes)
        write_json(Path(directory) / "sequential.json", out.to_json())
        return out


def run_sequential(url: str | Sequence[str], base: ProbeRun, bad: ProbeRun,
                   repeat: ProbeRun | None, *,
                   false_fail: float, false_pass: float, seed: int = 0,
                   batch: int = DEFAULT_BATCH, api_key: str | None = None,
                   model: str | None = None,
                   policy: TrialPolicy = DEFAULT_POLICY) -> SequentialResult:
    """Probe the trial at `url` sequentially against the ends `base` (good), `bad`, `repeat`.

    Every request is sent under the condition the ends measured it in: a concurrency-1 row
    alone (`chat_row`), a row of a level above 1 with its whole concurrency group, `level` in
    flight in the level's submission order (`group_rows`).

    Several urls: replicas of one configuration, its shards (probe/shards.py). The drift
    transcripts and each batch's units are dealt to them in the order one server gets them
    (`split_batch`; a concurrency group goes whole to one shard) and sent at once; the answers
    are observed in that order, so the test draws, decides and stops exactly as on one server,
    and every shard stops with it."""
    for other in (bad, repeat):
        if other is not None and (other.spec.spec_hash(), other.spec.seed_block) != (
                base.spec.spec_hash(), base.spec.seed_block):
            raise ConfigError("the ends were probed with different probe specs",
                              "probe the good end, its repeat and the bad end with one spec")
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ConfigError("no server to probe", "give the trial's url (or its shards' urls)")
    spec = base.spec
    test = SequentialTrial(ends_from_runs(base, bad, repeat), false_fail, false_pass,
                           seed=seed, batch=batch, policy=policy)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    clients = [ProbeClient(u, api_key=api_key, timeout_s=spec.timeout_s, retries=spec.retries,
                           model=model) for u in urls]
    rows: list[dict[str, Any]] = []
    records = []
    notes: list[str] = []
    used: set[str] = set()
    per_shard = [0] * len(clients)
    pool = ThreadPoolExecutor(max_workers=len(clients), thread_name_prefix="probe-shard")

    def dealt(work: list[T], ask: Callable[[ProbeClient, T], R],
              size: Callable[[T], int] = lambda _w: 1) -> list[R]:
        """`work` dealt to the shards, sent at once; the answers in `work`'s order."""
        parts = split_batch(work, len(clients))
        futures = [pool.submit(lambda c=c, p=p: [ask(c, w) for w in p])
                   for c, p in zip(clients, parts)]
        answers = [f.result() for f in futures]
        for i, p in enumerate(parts):
            per_shard[i] += sum(size(w) for w in p)
        return [answers[i % len(clients)][i // len(clients)] for i in range(len(work))]

    try:
        servers = [c.describe() for c in clients]
        server = servers[0]
        if any(s.model != server.model for s in servers):
            raise ConfigError(f"the trial's shards serve different models "
                              f"({sorted({s.model for s in servers})})",
                              "launch every shard of a trial in the same configuration")
        for c, s in zip(clients, servers):  # every shard's server gets its polluting phase
            warmup_phase(c, spec, s, notes)
        ref = base.drift_by_case()
        drift_cases = [c for c in base.cases if c.family == "drift" and c.case_id in ref]
        try:
            scored = dealt(drift_cases, lambda c, case: drift_row(c, spec, case,
                                                                    ref[case.case_id]))
        except DriftUnsupported as exc:
            notes.append(str(exc))
            scored = []
        for case, (row, rec) in zip(drift_cases, scored):
            rows.append(row)
            if rec is not None:
                records.append(rec)
            used.add(case.case_id)
        partial = ProbeRun(spec, urls[0], {}, (), tuple(rows), tuple(records))
        decision = test.observe_drift(DriftFigures.of(drift_check(base, repeat, partial)))
        non_finite = non_finite_cases(partial.rows)
        if non_finite:  # the trial's own server computed NaN/inf: its configuration fails
            decision = test.decide_non_finite(non_finite)
        by_id = {c.case_id: c for c in base.cases}

        def send(c: ProbeClient, unit: tuple[EndCase, ...]) -> list[dict[str, Any]]:
            if unit[0].concurrency == 1:
                return [chat_row(c, spec, by_id[e.case_id], e.arm) for e in unit]
            return group_rows(c, spec, [(by_id[e.case_id], e.arm) for e in unit],
                              unit[0].concurrency)

        while decision is None:
            units = test.next_units()
            if not units:
                decision = test.decision
                break
            batch_cases = [e for u in units for e in u]
            answers = [row for rows_of in dealt(units, send, len) for row in rows_of]
            for end_case, row in zip(batch_cases, answers):
                rows.append(row)
                used.add(end_case.case_id)
                decision = test.observe(end_case.key, bool(row["correct"]),
                                        row.get("signatures") or ()) or decision
    finally:
        pool.shutdown(wait=True)
        for c in clients:
            c.close()
    assert decision is not None
    shard = None if len(urls) == 1 else {
        "count": len(urls), "parts": [{"index": i, "url": u, "rows": n}
                                      for i, (u, n) in enumerate(zip(urls, per_shard))]}
    run = ProbeRun(spec, urls[0], {"model": server.model, "max_model_len": server.max_model_len,
                                   "compress_ratios": list(server.compress_ratios)
                                   if server.compress_ratios else None,
                                   "sliding_window": server.sliding_window, "info": server.info,
                                   "started_at": started},
                   tuple(c for c in base.cases if c.case_id in used), tuple(rows),
                   tuple(records), (*notes, "sequential trial probe: " + decision.reasons[0]),
                   {"total_s": round(time.perf_counter() - t0, 3)}, shard=shard)
    return SequentialResult(decision, run, seed, tuple(notes))
