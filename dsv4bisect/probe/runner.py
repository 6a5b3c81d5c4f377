"""Collect a probe run from a server, and judge a candidate against its baseline.

`collect(url, spec)` builds the cases on that server (lengths measured in its tokens) and runs
them; `collect(url, spec, reference_run=baseline)` replays the baseline's exact conversations
(byte-identical requests) and scores the drift transcripts the baseline produced. `judge`
applies the verdict rule (`probe/judge.py`) to baseline, A/A repeat and candidate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from dsv4bisect.errors import ConfigError, ProbeError
from dsv4bisect.probe.client import ProbeClient, ProbeHTTPError, ServerInfo
from dsv4bisect.probe.drift import NON_FINITE, DriftRecord, NonFiniteScores, compare
from dsv4bisect.probe.grid import DEFAULT_RATIOS, Case, build_cases
from dsv4bisect.probe.judge import decide
from dsv4bisect.probe.layout import calibrate
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.scoring import score
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.probe.vocab import PROBE_VOCAB


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
            "info": server.info}


def _build(client: ProbeClient, spec: ProbeSpec, server: ServerInfo, notes: list[str],
           on_progress: Progress | None) -> list[Case]:
    ratios = server.compress_ratios
    if not ratios:
        ratios = DEFAULT_RATIOS
        notes.append(f"server did not report compress_ratios; jitter uses {list(ratios)}")
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


def chat_row(client: ProbeClient, spec: ProbeSpec, case: Case, arm: str) -> dict[str, Any]:
    """One accuracy request, scored (also the sequential trial probe's request)."""
    messages = list(case.messages)
    if arm == "warm":  # replay turn by turn so the server's prefix cache is exercised
        for i, m in enumerate(messages[:-1]):
            if m["role"] == "user":
                client.chat(messages[: i + 1], max_tokens=1)
    else:
        client.flush_cache()
    think = arm == "think"
    budget = spec.thinking_max_tokens if think else case.max_tokens
    res = client.chat(messages, max_tokens=budget, thinking=think)
    if res.prompt_tokens != case.prompt_tokens:
        raise ProbeError(
            f"case {case.case_id}: the server counts {res.prompt_tokens} prompt tokens, the "
            f"baseline counted {case.prompt_tokens}",
            "baseline and candidate must serve the same tokenizer and chat template")
    s = score(res.text, case.expected, case.values, res.finish_reason)
    return {**_row_head(case, arm), "prompt_tokens": res.prompt_tokens, "output": res.text,
            "correct": s.correct, "exact": s.exact, "first_wrong_char": s.first_wrong_char,
            "edit_distance": s.edit_distance, "signatures": list(s.signatures),
            "finish_reason": res.finish_reason, "completion_tokens": res.completion_tokens,
            "latency_s": round(res.latency_s, 4)}


def _row_head(case: Case, arm: str) -> dict[str, Any]:
    return {"case_id": case.case_id, "family": case.family, "cell": case.cell.key,
            "length": case.cell.length, "depth": case.cell.depth, "turns": case.cell.turns,
            "seed": case.seed, "arm": arm, "target": case.target, "expected": case.expected}


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
    else:
        input_ids, start = ref.input_ids, ref.start
    try:
        pos, lps, tops = client.score(input_ids, start=start, top_k=spec.drift_top_k)
    except NonFiniteScores as exc:
        return ({**_row_head(case, "drift"), "prompt_tokens": len(input_ids), "output": None,
                 "correct": None, "signatures": [NON_FINITE], "non_finite": exc.message,
                 "n_positions": 0, "latency_s": round(time.perf_counter() - t0, 4)}, None)
    rec = DriftRecord(case.case_id, input_ids, start, tuple(pos), tuple(lps),
                      tuple(tuple(t) for t in tops))
    row = {**_row_head(case, "drift"), "prompt_tokens": len(input_ids), "output": None,
           "correct": None, "signatures": [], "n_positions": len(pos),
           "latency_s": round(time.perf_counter() - t0, 4)}
    if ref is not None:
        cmp = compare(ref, rec)
        row |= {"kl_mean": sum(cmp.kl) / max(1, len(cmp.kl)),
                "top1_agreement": sum(cmp.top1_same) / max(1, len(cmp.top1_same)),
                "first_divergence": cmp.first_divergence}
    return row, rec


def collect(url: str, spec: ProbeSpec, *, reference_run: ProbeRun | None = None,
            api_key: str | None = None, on_progress: Progress | None = None,
            model: str | None = None) -> ProbeRun:
    """Probe the server at `url`; with `reference_run`, replay its cases and drift transcripts.

    `model` overrides the served model name (default: the first id of /v1/models).
    """
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    client = ProbeClient(url, api_key=api_key, timeout_s=spec.timeout_s, retries=spec.retries,
                         model=model)
    try:
        server = client.describe()
        notes: list[str] = []
        if reference_run is not None:
            ref = reference_run.spec
            if (ref.spec_hash(), ref.seed_block) != (spec.spec_hash(), spec.seed_block):
                raise ConfigError(
                    f"the baseline run was collected with probe spec {ref.tier} "
                    f"({ref.spec_hash()}, seed block {ref.seed_block}), not {spec.tier} "
                    f"({spec.spec_hash()}, seed block {spec.seed_block})",
                    "probe the candidate with the baseline's spec, or collect a new baseline")
            cases = list(reference_run.cases)
        else:
            cases = _build(client, spec, server, notes, on_progress)
        t_build = time.perf_counter() - t0
        rows, drift = _run_cases(client, spec, cases, reference_run, notes, on_progress)
    finally:
        client.close()
    timing = {"build_s": round(t_build, 3), "total_s": round(time.perf_counter() - t0, 3)}
    return ProbeRun(spec, url, {**_server_dict(server), "started_at": started}, tuple(cases),
                    tuple(rows), tuple(drift), tuple(notes), timing)


def _tasks(spec: ProbeSpec, cases: list[Case]) -> list[tuple[Case, str]]:
    tasks = [(c, arm) for c in cases if c.family != "drift" for arm in spec.arms]
    if spec.thinking:
        tasks += [(c, "think") for c in cases if c.family == "needle"]
    return tasks + [(c, "drift") for c in cases if c.family == "drift"]


def _run_cases(client: ProbeClient, spec: ProbeSpec, cases: list[Case],
               reference_run: ProbeRun | None, notes: list[str], on_progress: Progress | None
               ) -> tuple[list[dict[str, Any]], list[DriftRecord]]:
    tasks = _tasks(spec, cases)
    ref_drift = reference_run.drift_by_case() if reference_run else {}
    rows: list[dict[str, Any]] = []
    drift: list[DriftRecord] = []
    t0, tokens, correct, scored, think_ok, drift_ok = time.perf_counter(), 0, 0, 0, True, True
    for done, (case, arm) in enumerate(tasks, 1):
        if arm == "drift":
            if not drift_ok or (reference_run is not None and case.case_id not in ref_drift):
                continue  # the baseline could not score this transcript
            try:
                row, rec = drift_row(client, spec, case, ref_drift.get(case.case_id))
            except DriftUnsupported as exc:
                drift_ok = False
                notes.append(str(exc))
                continue
            if rec is not None:
                drift.append(rec)
        elif arm == "think" and not think_ok:
            continue
        else:
            try:
                row = chat_row(client, spec, case, arm)
            except ProbeHTTPError as exc:
                if arm != "think" or exc.status != 400:
                    raise
                think_ok = False
                notes.append(f"thinking arm skipped: the server refused thinking ({exc.message})")
                continue
            correct += bool(row["correct"])
            scored += 1
        rows.append(row)
        tokens += row["prompt_tokens"] + int(row.get("completion_tokens") or 0)
        if on_progress:
            elapsed = max(1e-9, time.perf_counter() - t0)
            on_progress(ProbeProgress("probe", done, len(tasks), tokens / elapsed, correct, scored))
    if on_progress and tasks:  # skipped tasks at the end: still report the stage as complete
        elapsed = max(1e-9, time.perf_counter() - t0)
        on_progress(ProbeProgress("probe", len(tasks), len(tasks), tokens / elapsed, correct,
                                  scored))
    return rows, drift


def judge(baseline: ProbeRun, baseline_repeat: ProbeRun | None, candidate: ProbeRun) -> Verdict:
    """The verdict for `candidate` against `baseline` (with its A/A repeat as noise floor)."""
    return decide(baseline, baseline_repeat, candidate)
