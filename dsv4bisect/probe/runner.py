"""Collect a probe run from a server, and judge a candidate against its baseline.

`collect(url, spec)` builds the cases on that server (lengths measured in its tokens) and runs
them; `collect(url, spec, reference_run=baseline)` replays the baseline's exact conversations
(byte-identical requests) and scores the drift transcripts the baseline produced. `judge`
applies the verdict rule (`probe/judge.py`) to baseline, A/A repeat and candidate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from dsv4bisect.errors import ConfigError, ProbeError
from dsv4bisect.probe.client import ProbeClient, ProbeHTTPError, ServerInfo, map_on_clones
from dsv4bisect.probe.drift import NON_FINITE, DriftRecord, NonFiniteScores, compare
from dsv4bisect.probe.grid import DEFAULT_RATIOS, DEFAULT_WINDOW, Case, build_cases, periods
from dsv4bisect.probe.judge import decide
from dsv4bisect.probe.layout import calibrate
from dsv4bisect.probe.null import CONCURRENT_ARM, RECHUNK_ARM
from dsv4bisect.probe.stream import latency_figures
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.scoring import score
from dsv4bisect.probe.shards import Shard, merge, shard_cases
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.probe.tasks import Task, submission_order, tasks_of
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.probe.vocab import PROBE_VOCAB
from dsv4bisect.probe.warmup import pollute


class DriftUnsupported(Exception):
    """The server lacks what the drift family needs; the family is skipped with a note."""


@dataclass(frozen=True)
class ProbeProgress:
    """What a progress display needs; sent after every case built and every request."""

    phase: str  # "build" | "probe"
    done: int
    total: int
    tokens_per_s: float
    correct: int
    scored: int

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.scored if self.scored else None


Progress = Callable[[ProbeProgress], None]


def _server_dict(server: ServerInfo) -> dict[str, Any]:
    return {"model": server.model, "max_model_len": server.max_model_len,
            "compress_ratios": list(server.compress_ratios) if server.compress_ratios else None,
            "sliding_window": server.sliding_window,
            "info": server.info}


def _build(client: ProbeClient, spec: ProbeSpec, server: ServerInfo, notes: list[str],
           on_progress: Progress | None) -> list[Case]:
    ratios = server.compress_ratios
    if not ratios:
        ratios = DEFAULT_RATIOS
        notes.append(f"server did not report compress_ratios; jitter uses {list(ratios)}")
    if not server.sliding_window:
        notes.append(f"server did not report sliding_window; jitter uses {DEFAULT_WINDOW}")
    ratios = periods(ratios, server.sliding_window)
    lengths = list(spec.lengths)
    if server.max_model_len:
        room = server.max_model_len - max(spec.max_tokens, spec.thinking_max_tokens
                                          if spec.thinking else 0) - 256
        lengths = [n for n in spec.lengths if n <= room]
        if len(lengths) < len(spec.lengths):
            notes.append(f"lengths over max_model_len {server.max_model_len} skipped: "
                         f"{[n for n in spec.lengths if n not in lengths]}")
    if not lengths:
        raise ProbeError(f"no probe length fits the server's max_model_len {server.max_model_len}",
                         "use a smaller tier or a server with a longer context")
    calib = calibrate(client.count, PROBE_VOCAB)

    def built(done: int, total: int) -> None:
        if on_progress:
            on_progress(ProbeProgress("build", done, total, 0.0, 0, 0))

    return build_cases(spec, PROBE_VOCAB, client.count, calib, ratios, lengths=lengths,
                       on_case=built)


def chat_row(client: ProbeClient, spec: ProbeSpec, case: Case, arm: str,
             concurrency: int = 1) -> dict[str, Any]:
    """One accuracy request, scored (also the sequential trial probe's request). `concurrency`
    is the level it runs at: above 1 a cold request does not flush the cache (that would empty
    it under its batch mates; the level flushes once before it starts). A `hit` request is the
    same request sent again (a client's retry or regenerate): first once with max_tokens=1,
    then scored, so the scored one is a prefix-cache hit on its whole prompt wherever it runs
    (right after its case's cold request, the first send is itself a hit and costs no
    prefill)."""
    messages = list(case.messages)
    if arm == "warm":  # replay turn by turn so the server's prefix cache is exercised
        for i, m in enumerate(messages[:-1]):
            if m["role"] == "user":
                client.chat(messages[: i + 1], max_tokens=1)
    elif arm == "hit":
        client.chat(messages, max_tokens=1)
    elif concurrency == 1:
        client.flush_cache()
    think = arm == "think"
    budget = spec.thinking_max_tokens if think else case.max_tokens
    # streamed, as users ask; the embedded engine's vLLM API subset answers unstreamed
    # (docs/vllm.md), so a vLLM server is asked plainly and its lines carry no TTFT/ITL
    res = client.chat(messages, max_tokens=budget, thinking=think, stream=not client.vllm())
    if res.prompt_tokens != case.prompt_tokens:
        raise ProbeError(
            f"case {case.case_id}: the server counts {res.prompt_tokens} prompt tokens, the "
            f"baseline counted {case.prompt_tokens}",
            "baseline and candidate must serve the same tokenizer and chat template")
    s = score(res.text, case.expected, case.values, res.finish_reason)
    return {**_row_head(case, arm, concurrency), "prompt_tokens": res.prompt_tokens,
            "output": res.text,
            "correct": s.correct, "exact": s.exact, "first_wrong_char": s.first_wrong_char,
            "edit_distance": s.edit_distance, "signatures": list(s.signatures),
            "finish_reason": res.finish_reason, "completion_tokens": res.completion_tokens,
            "cached_tokens": res.cached_tokens, "latency_s": round(res.latency_s, 4),
            "ttft_s": _rounded(res.ttft_s), "itl_s": _rounded(res.itl_s), "itl_n": res.itl_n}


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 5)


def _row_head(case: Case, arm: str, concurrency: int = 1) -> dict[str, Any]:
    return {"case_id": case.case_id, "family": case.family, "cell": case.cell.key,
            "length": case.cell.length, "depth": case.cell.depth, "turns": case.cell.turns,
            "seed": case.seed, "arm": arm, "concurrency": concurrency, "target": case.target,
            "expected": case.expected}


def drift_row(client: ProbeClient, spec: ProbeSpec, case: Case,
              ref: DriftRecord | None) -> tuple[dict[str, Any], DriftRecord | None]:
    """One drift transcript: generated (baseline) or scored against `ref` (any other run).

    A server that scores it with NaN/±inf logprobs gives a row with the `non_finite` hard
    signature and no record (`judge.non_finite_rule` turns it into FAIL or CANNOT_TEST)."""
    t0 = time.perf_counter()
    client.flush_cache()
    if ref is None:  # baseline: transcript = prompt ids + the baseline's own greedy answer
        ids = client.tokenize_messages(case.messages)
        if ids is None:
            raise DriftUnsupported("drift skipped: the server cannot tokenize chat messages "
                                   "(/tokenize with `messages`), so there are no prompt ids")
        answer = client.generate(ids, max_new_tokens=case.max_tokens)
        input_ids = tuple(ids + answer)
        start = max(1, len(input_ids) - spec.drift_window)
        answer_start: int | None = len(ids)
    else:
        input_ids, start, answer_start = ref.input_ids, ref.start, ref.answer_start
    try:
        pos, lps, tops = client.score(input_ids, start=start, top_k=spec.drift_top_k)
    except NonFiniteScores as exc:
        return ({**_row_head(case, "drift"), "prompt_tokens": len(input_ids), "output": None,
                 "correct": None, "signatures": [NON_FINITE], "non_finite": exc.message,
                 "n_positions": 0, "latency_s": round(time.perf_counter() - t0, 4)}, None)
    rec = DriftRecord(case.case_id, input_ids, start, tuple(pos), tuple(lps),
                      tuple(tuple(t) for t in tops), answer_start)
    row = {**_row_head(case, "drift"), "prompt_tokens": len(input_ids), "output": None,
           "correct": None, "signatures": [], "n_positions": len(pos),
           "latency_s": round(time.perf_counter() - t0, 4)}
    if ref is not None:
        cmp = compare(ref, rec)
        row |= {"kl_mean": sum(cmp.kl) / max(1, len(cmp.kl)),
                "top1_agreement": sum(cmp.top1_same) / max(1, len(cmp.top1_same)),
                "first_divergence": cmp.first_divergence}
    return row, rec


def open_client(url: str, spec: ProbeSpec, api_key: str | None,
                model: str | None) -> ProbeClient:
    """The probe's client of the server at `url`, with the spec's timeout and retries."""
    return ProbeClient(url, api_key=api_key, timeout_s=spec.timeout_s, retries=spec.retries,
                       model=model)


def check_same_spec(spec: ProbeSpec, ref: ProbeSpec) -> None:
    """A candidate replays the good end's run only under the spec and seed block it ran."""
    if (ref.spec_hash(), ref.seed_block) != (spec.spec_hash(), spec.seed_block):
        raise ConfigError(
            f"the baseline run was collected with probe spec {ref.tier} ({ref.spec_hash()}, "
            f"seed block {ref.seed_block}), not {spec.tier} ({spec.spec_hash()}, seed block "
            f"{spec.seed_block})",
            "probe the candidate with the baseline's spec, or collect a new baseline")


def collect(url: str, spec: ProbeSpec, *, reference_run: ProbeRun | None = None,
            api_key: str | None = None, on_progress: Progress | None = None,
            model: str | None = None, shard: Shard | None = None,
            skip: frozenset[str] = frozenset()) -> ProbeRun:
    """Probe the server at `url`; with `reference_run`, replay its cases and drift transcripts.

    `model` overrides the served model name (default: the first id of /v1/models). `shard`:
    run only that shard's cases (probe/shards.py; the run keeps every case, so that the shards'
    merge can check they all built the same ones). `skip`: case ids whose requests another run
    already holds (an earlier look of the same ends: probe/looks.py `extend` adds them); no
    request of theirs is sent, and a fresh baseline scores its null model only on the drift
    transcripts it probed.
    """
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    client = open_client(url, spec, api_key, model)
    try:
        server = client.describe()
        notes: list[str] = []
        if reference_run is not None:
            check_same_spec(spec, reference_run.spec)
            cases = list(reference_run.cases)
        else:
            cases = _build(client, spec, server, notes, on_progress)
        t_build = time.perf_counter() - t0
        warm = warmup_phase(client, spec, server, notes)
        mine = None if shard is None else shard_cases(spec, cases, shard)
        if skip:
            mine = (mine if mine is not None else {c.case_id for c in cases}) - skip
        rows, drift, throughput = _run_cases(client, spec, cases, reference_run, notes,
                                             on_progress, mine)
        null = null_arms(client, spec, drift, notes) if reference_run is None else []
    finally:
        client.close()
    timing = {"build_s": round(t_build, 3), "total_s": round(time.perf_counter() - t0, 3)}
    if warm["requests"]:
        timing |= {"warmup_requests": warm["requests"], "warmup_s": warm["seconds"]}
    return ProbeRun(spec, url, {**_server_dict(server), "started_at": started}, tuple(cases),
                    tuple(rows), tuple(drift), tuple(notes), timing, throughput=throughput,
                    null=tuple(null), shard=None if shard is None else shard.to_dict())


def warmup_phase(client: ProbeClient, spec: ProbeSpec, server: ServerInfo,
                 notes: list[str]) -> dict[str, float]:
    """The polluting phase before the measured requests (probe/warmup.py), noted in the run."""
    warm = pollute(client, spec, server)
    if warm["requests"]:
        notes.append(f"polluting phase: {warm['requests']:.0f} requests of other conversations "
                     f"on the same server before the measured ones ({warm['seconds']:.0f} s)")
    return warm


def null_arms(client: ProbeClient, spec: ProbeSpec, drift: list[DriftRecord],
              notes: list[str]) -> list[tuple[str, DriftRecord]]:
    """The good end's drift transcripts scored again under the harmless changes a server makes
    to itself (`probe/null.py`): all at once in a shuffled order (other batch mates, another
    prefill chunking), and each re-chunked at a quarter, half and three quarters of its scored
    window: the prefix up to there as a request of its own (an earlier turn), then the whole
    transcript, the prefix served from the prefix cache (a hit) and the rest prefilled from
    there."""
    if not drift:
        return []
    level = min(len(drift), max(16, *spec.concurrency))  # a server under load batches them
    out: list[tuple[str, DriftRecord]] = []
    try:
        client.flush_cache()  # once: what is cached then comes from the batch mates themselves
        order = submission_order(spec, max(level, 2), len(drift))
        got = dict(zip(order, map_on_clones(
            client, lambda c, k: _rescore(c, spec, drift[k]), order, level,
            spec.timeout_s * level, "probe-null")))
        out += [(CONCURRENT_ARM, got[k]) for k in range(len(drift))]
        for rec, quarter in ((rec, q) for rec in drift for q in (1, 2, 3)):
            split = rec.start + (len(rec.input_ids) - rec.start) * quarter // 4
            client.flush_cache()
            out.append((RECHUNK_ARM, _rechunked(client, spec, rec, split)))
    except NonFiniteScores as exc:
        notes.append(f"null model not measured: the good end scored non-finite logprobs when "
                     f"re-batched ({exc.message})")
        return []
    return out


def _rechunked(client: ProbeClient, spec: ProbeSpec, rec: DriftRecord, split: int
               ) -> DriftRecord:
    """`rec`'s transcript prefilled in two pieces, as a server computes it when its first
    `split` tokens were a request of their own (an earlier turn of the conversation, a shared
    prefix sent first): that prefix alone, in forwards of its own token count, scored and
    cached (SGLang caches a finished request's prompt in its radix tree); then the transcript,
    whose prefix is a cache hit and whose rest is prefilled from `split` in forwards of the
    rest's token count. Every scored position but the split's own (the prefix request's
    output, not an input position) is scored once: before the split at the prefix's chunking
    and dispatch, after it at the rest's, as a prefill chunked at `split` gives them."""
    pos, lps, tops = client.score(rec.input_ids[:split], start=rec.start,
                                  top_k=spec.drift_top_k, max_new_tokens=1)
    rest = _rescore(client, spec, rec, start=split)
    return DriftRecord(rec.case_id, rec.input_ids, rec.start, (*pos, *rest.positions),
                       (*lps, *rest.token_logprobs), (*(tuple(t) for t in tops), *rest.top),
                       rec.answer_start)


def _rescore(client: ProbeClient, spec: ProbeSpec, rec: DriftRecord,
             start: int | None = None) -> DriftRecord:
    start = rec.start if start is None else start
    pos, lps, tops = client.score(rec.input_ids, start=start, top_k=spec.drift_top_k)
    return DriftRecord(rec.case_id, rec.input_ids, start, tuple(pos), tuple(lps),
                       tuple(tuple(t) for t in tops), rec.answer_start)



def collect_sharded(urls: Sequence[str], spec: ProbeSpec, *,
                    reference_run: ProbeRun | None = None, api_key: str | None = None,
                    on_progress: Progress | None = None, model: str | None = None,
                    skip: frozenset[str] = frozenset()) -> ProbeRun:
    """`collect` split across replicas of one configuration (probe/shards.py): shard i on
    `urls[i]`, all at once, merged into the run one server makes. `urls[0]` is the caller's own
    engine: a shard whose replica fails (its node or engine lost) is re-run, whole, there
    afterwards (the same requests: the assignment is the seed's), so no request is counted
    twice or missing; a failure of `urls[0]` itself is raised (the caller's engine)."""
    count = len(urls)

    def one(i: int, url: str) -> ProbeRun:
        return collect(url, spec, reference_run=reference_run, api_key=api_key, model=model,
                       on_progress=on_progress if url == urls[0] else None,
                       shard=Shard(i, count), skip=skip)

    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(one, i, u) for i, u in enumerate(urls)]
        runs: list[ProbeRun | None] = []
        for i, future in enumerate(futures):
            try:
                runs.append(future.result())
            except Exception:
                if i == 0:
                    raise
                runs.append(None)
    return merge([run if run is not None else one(i, urls[0]) for i, run in enumerate(runs)])


@dataclass
class _Tally:
    """Progress over a whole run and throughput per level."""

    total: int
    on_progress: Progress | None
    t0: float = field(default_factory=time.perf_counter)
    done: int = 0
    tokens: int = 0
    correct: int = 0
    scored: int = 0

    def add(self, row: dict[str, Any] | None) -> None:
        self.done += 1
        if row is not None:
            self.tokens += row["prompt_tokens"] + int(row.get("completion_tokens") or 0)
            if row.get("correct") is not None:
                self.correct += bool(row["correct"])
                self.scored += 1
        self.report(self.done)

    def report(self, done: int) -> None:
        if self.on_progress:
            elapsed = max(1e-9, time.perf_counter() - self.t0)
            self.on_progress(ProbeProgress("probe", done, self.total, self.tokens / elapsed,
                                           self.correct, self.scored))


def _run_cases(client: ProbeClient, spec: ProbeSpec, cases: list[Case],
               reference_run: ProbeRun | None, notes: list[str], on_progress: Progress | None,
               mine: set[str] | None = None, part: str | None = None
               ) -> tuple[list[dict[str, Any]], list[DriftRecord], dict[str, Any]]:
    """Every request of `cases` (`mine`: only those of these case ids, a shard's), in the
    order and at the levels of an unsharded run. `part`: "accuracy" (every request but the
    drift transcripts) or "drift" (only those; probe/ahead.py), None: all."""
    every = tasks_of(spec, cases)
    keep = [(mine is None or c.case_id in mine)
            and (part is None or (arm == "drift") == (part == "drift"))
            for c, arm, _ in every]
    where = [n for n, k in enumerate(keep) if k]  # a shard's task -> the whole run's
    tasks = [every[n] for n in where]
    ref_drift = reference_run.drift_by_case() if reference_run else {}
    tally = _Tally(len(tasks), on_progress)
    results: dict[int, dict[str, Any]] = {}
    drift: list[DriftRecord] = []
    throughput: dict[str, Any] = {}
    think_ok, drift_ok = True, True
    for level in spec.concurrency:
        batch = [i for i, (_, arm, lv) in enumerate(tasks) if lv == level and arm in spec.arms]
        if level > 1 and batch:
            t0 = time.perf_counter()
            # a shard sends its requests in the order the whole level sends them
            full = [i for i, (_, arm, lv) in enumerate(every) if lv == level and arm in spec.arms]
            sent = [full[k] for k in submission_order(spec, level, len(full))]
            position = {task: n for n, task in enumerate(sent)}
            own = sorted(range(len(batch)), key=lambda k: position[where[batch[k]]])
            results.update(_concurrent(client, spec, [tasks[i] for i in batch], batch, level,
                                       tally, own))
            throughput[str(level)] = _level_figures([results[i] for i in batch],
                                                    time.perf_counter() - t0)
            continue
        t0 = time.perf_counter()
        for i in batch:
            case, arm, _ = tasks[i]
            results[i] = chat_row(client, spec, case, arm)
            tally.add(results[i])
        if batch:
            throughput["1"] = _level_figures([results[i] for i in batch],
                                             time.perf_counter() - t0)
    for i, (case, arm, _) in enumerate(tasks):
        if i in results or arm in spec.arms:
            continue
        if arm == "drift":
            if not drift_ok or (reference_run is not None and case.case_id not in ref_drift):
                tally.add(None)
                continue  # the baseline could not score this transcript
            try:
                row, rec = drift_row(client, spec, case, ref_drift.get(case.case_id))
            except DriftUnsupported as exc:
                drift_ok = False
                notes.append(str(exc))
                tally.add(None)
                continue
            if rec is not None:
                drift.append(rec)
            results[i] = row
        elif think_ok:  # the thinking arm
            try:
                results[i] = chat_row(client, spec, case, arm)
            except ProbeHTTPError as exc:
                if exc.status != 400:
                    raise
                think_ok = False
                notes.append(f"thinking arm skipped: the server refused thinking ({exc.message})")
                tally.add(None)
                continue
        tally.add(results.get(i))
    if tasks:  # skipped tasks at the end: still report the stage as complete
        tally.report(len(tasks))
    return [results[i] for i in sorted(results)], drift, throughput


def _concurrent(client: ProbeClient, spec: ProbeSpec, tasks: list[Task], ids: list[int],
                level: int, tally: _Tally, order: list[int] | None = None
                ) -> dict[int, dict[str, Any]]:
    """A level's requests with `level` in flight at once, sent in `order` (default:
    `submission_order`); each
    worker has its own connection. The first error (or an interrupt from the progress
    callback) cancels what has not started and is raised at once; requests in flight end on
    their own (their answers or the server's stop)."""
    # Once, before anything is in flight: every level starts from an empty cache, so what a
    # request finds cached comes from its own conversation and its batch mates at this level.
    client.flush_cache()
    local = threading.local()
    clients: list[ProbeClient] = []
    lock = threading.Lock()

    def own_client() -> ProbeClient:
        if not hasattr(local, "client"):
            # A request waits behind up to level - 1 others on a server that runs one at a
            # time (they queue), so its deadline is the per-request timeout times the level.
            local.client = client.clone(timeout_s=spec.timeout_s * level)
            with lock:
                clients.append(local.client)
        return local.client

    def run(k: int) -> dict[str, Any]:
        case, arm, _ = tasks[k]
        return chat_row(own_client(), spec, case, arm, concurrency=level)

    out: dict[int, dict[str, Any]] = {}
    pool = ThreadPoolExecutor(max_workers=level, thread_name_prefix=f"probe-c{level}")
    try:
        sent = submission_order(spec, level, len(tasks)) if order is None else order
        futures = {pool.submit(run, k): k for k in sent}
        for future in as_completed(futures):
            k = futures[future]
            out[ids[k]] = future.result()
            tally.add(out[ids[k]])
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # no wait on a failing or stopped server
        raise
    pool.shutdown(wait=True)
    for c in clients:
        c.close()
    return out


def group_rows(client: ProbeClient, spec: ProbeSpec, requests: Sequence[tuple[Case, str]],
               level: int) -> list[dict[str, Any]]:
    """A concurrency group of a sequential trial (probe/sequential.py, `condition_groups`):
    its requests sent as the fixed probe sends a level (one cache flush, then `level` in
    flight, in the given order: the level's submission order), the rows in that order."""
    tasks = [(case, arm, level) for case, arm in requests]
    got = _concurrent(client, spec, tasks, list(range(len(tasks))), level,
                      _Tally(len(tasks), None), list(range(len(tasks))))
    return [got[k] for k in range(len(tasks))]


def _level_figures(rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Throughput of one level: scored requests and their prompt + completion tokens per
    second of the level's wall time (a warm arm's replay requests are not counted)."""
    tokens = sum(r["prompt_tokens"] + int(r.get("completion_tokens") or 0) for r in rows)
    wall = max(wall_s, 1e-9)
    return {"requests": len(rows), "tokens": tokens, "wall_s": round(wall_s, 3),
            "requests_per_s": round(len(rows) / wall, 4), "tokens_per_s": round(tokens / wall, 1),
            "arms": sorted({r["arm"] for r in rows}), **latency_figures(rows)}


def judge(baseline: ProbeRun, baseline_repeat: ProbeRun | None, candidate: ProbeRun) -> Verdict:
    """The verdict for `candidate` against `baseline` (with its A/A repeat as noise floor)."""
    return decide(baseline, baseline_repeat, candidate)
