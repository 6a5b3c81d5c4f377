"""The scheduler's decode step with MTP speculative decoding (`speculative.py` for the rule).

One step of the decode batch, every running request at once:
1. draft: `num_steps` MTP forwards (ragged over the batch), each request's chain on a fork of its
   MTP state (the drafted rows are never kept): step 1 reads the held main streams of the last
   emitted token's predecessor and that token, step i > 1 its previous step's output streams and
   draft; the draft is the MTP layer's argmax (top-1 chain). A request drafts no more than its
   `max_new_tokens` leaves room for after this step's own token.
2. verify: one main-model forward (`forward_ragged`) over every request's 1 + k_i tokens (the
   last emitted token, then its drafts), each on a fork of its cache, traced.
3. accept (`speculative.verify`), cut where a stop id or `max_new_tokens` ends the request, then
   commit: the cache advances by exactly the rows of the tokens kept (the fork when every row
   is kept, else `commit_rows` on the pre-step cache), the MTP state is fed those rows' streams,
   and only then are the tokens emitted (a finished request's prefix-cache snapshot is taken on
   emit, so it holds the committed state).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from dsv4bisect.reference.mtp import feed_mtp, mtp_ragged
from dsv4bisect.reference.request import Request
from dsv4bisect.reference.spec_settings import SpecSettings
from dsv4bisect.reference.speculative import Verdict, commit_rows


class Rounds(Protocol):
    """What a speculative decode step needs from the scheduler that runs it."""

    model: Any  # the Transformer, with its MTP layer
    engine: Any  # its ReferenceEngine (`device`)
    spec: SpecSettings

    def choose_verdict(self, r: Request, drafts: list[int], rows: torch.Tensor) -> Verdict: ...

    def note_round(self, proposed: int, verdict: Verdict) -> None: ...

    def emit(self, r: Request, logits: torch.Tensor, token: int | None = None) -> bool: ...


def spec_decode(sched: Rounds, reqs: list[Request]) -> list[Request]:
    """One speculative decode step over `reqs`; returns those that finished."""
    model, device, steps = sched.model, sched.engine.device, sched.spec.num_steps
    last = [r.output_ids[-1] for r in reqs]
    drafts = _draft(sched, reqs, last, [min(steps, r.max_new_tokens - len(r.output_ids) - 1)
                                        for r in reqs])
    forks = [r.cache.fork() for r in reqs]
    traces: list[dict] = [{} for _ in reqs]
    h = model.forward_ragged(
        [(torch.tensor([y, *d], device=device), c)
         for y, d, c in zip(last, drafts, forks, strict=True)], traces)
    logits = model.logits(h)  # [Σ(1 + k_i), V]
    plans, at = [], 0
    for r, y, d, fork, trace in zip(reqs, last, drafts, forks, traces, strict=True):
        rows = logits[at : at + 1 + len(d)]
        verdict = sched.choose_verdict(r, d, rows)
        m = _kept(r, verdict.tokens)
        if m == 1 + len(d):
            r.cache = fork
        else:
            commit_rows(model, r.cache, trace, m)
        plans.append((r, len(d), rows, verdict, m, h[at : at + m],
                      torch.tensor([y, *verdict.tokens[: m - 1]], device=device)))
        at += 1 + len(d)
    feed_mtp(model, [(hh, toks, r.cache.mtp) for r, _, _, _, _, hh, toks in plans])
    done = []
    for r, proposed, rows, verdict, m, _, _ in plans:
        sched.note_round(proposed, verdict)
        if any(sched.emit(r, rows[j], verdict.tokens[j]) for j in range(m)):
            done.append(r)
    return done


def _draft(sched: Rounds, reqs: list[Request], last: list[int],
           counts: list[int]) -> list[list[int]]:
    """Each request's chain of `counts[i]` MTP drafts (argmax), all requests batched per step."""
    device = sched.engine.device
    states = [r.cache.mtp.fork() for r in reqs]
    inputs = [(r.cache.mtp.h[None], y) for r, y in zip(reqs, last, strict=True)]
    drafts: list[list[int]] = [[] for _ in reqs]
    for step in range(max(counts, default=0)):
        active = [i for i, n in enumerate(counts) if n > step]
        out, logits = mtp_ragged(sched.model, [
            (inputs[i][0], torch.tensor([inputs[i][1]], device=device), states[i])
            for i in active])
        assert logits is not None
        tokens = torch.argmax(logits, -1).tolist()
        for j, i in enumerate(active):
            drafts[i].append(tokens[j])
            inputs[i] = (out[j : j + 1], tokens[j])
    return drafts


def _kept(r: Request, tokens: list[int]) -> int:
    """How many of the round's tokens the request emits: up to and including a stop id, and no
    more than `max_new_tokens` allows."""
    room = r.max_new_tokens - len(r.output_ids)
    for j, t in enumerate(tokens[:room]):
        if t in r.stop_ids:
            return j + 1
    return min(len(tokens), room)

