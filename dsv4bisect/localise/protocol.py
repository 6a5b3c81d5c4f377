"""The teacher-forced protocol both configurations run on the embedded engine, and its harmless
variations (the null arms).

A run feeds every transcript's tokens through the model exactly as the server's scheduler
would for that request, but with the tokens fixed (teacher forcing): its prompt prefilled
alone in chunks of the configuration's `chunk_size` (SGLang's extend batches), then its answer
one token per forward, all transcripts' answers in one decode batch (SGLang's decode batch:
one token per running request). So a fault that acts only in decode, or only when requests
share a forward (the split-K decode kernel, the FP8 KV write of a batch), acts here too; a
transcript decoded alone has a batch mate added (the start of its prompt, then the tokens that
follow there: real text of the same conversation), so there always is one.

Null arms: the good end running the same protocol with a harmless change, as a deployment
changes its own numerics under load (docs/probe.md "The null model"): `rechunk@f` prefills each
prompt split at the fraction f as a request whose prefix was cached (the prefix in forwards of
its own size, then the rest), `rebatch` prefills every sequence in shared forwards (first come
first served within the chunk budget, the chunked request first: SGLang's PrefillAdder) and
decodes them in the reverse order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch

from dsv4bisect.localise.capture import Recorder, Rows

MATE = 1000  # sequence ids of batch mates added by the protocol start here


@dataclass(frozen=True)
class Transcript:
    """One request's tokens: `prompt` of them prefilled, the rest decoded one per step."""

    case_id: str
    ids: tuple[int, ...]
    prompt: int

    def __post_init__(self) -> None:
        if not 1 <= self.prompt <= len(self.ids):
            raise ValueError(f"{self.case_id}: prompt {self.prompt} outside 1..{len(self.ids)}")


@dataclass(frozen=True)
class Arm:
    name: str  # base | rechunk@0.25 | ... | rebatch
    split: float | None = None  # rechunk: where the prefix request ends (fraction of the prompt)
    rebatch: bool = False


BASE = Arm("base")
NULL_ARMS = (Arm("rechunk@0.25", 0.25), Arm("rechunk@0.5", 0.5), Arm("rechunk@0.75", 0.75),
             Arm("rebatch", rebatch=True))


MATE_PROMPT = 128  # tokens of a batch mate's prompt: it only has to share the forwards


def with_mates(transcripts: Sequence[Transcript]) -> list[Transcript]:
    """The transcripts, plus a batch mate when only one would decode: the start of its prompt
    (at most MATE_PROMPT tokens, at most half of it), then as many tokens as its answer has."""
    out = list(transcripts)
    if len(out) == 1:
        t = out[0]
        head = max(1, min(MATE_PROMPT, t.prompt // 2))
        answer = max(1, len(t.ids) - t.prompt)
        out.append(Transcript(f"{t.case_id}#mate", t.ids[:head + answer], head))
    return out


def numbered(transcripts: Sequence[Transcript]) -> list[tuple[int, Transcript]]:
    """(sequence id, transcript): transcript i is sequence i, a mate added by `with_mates`
    MATE + i."""
    return [(MATE + i if t.case_id.endswith("#mate") else i, t)
            for i, t in enumerate(transcripts)]


def schedule(transcripts: Sequence[Transcript], arm: Arm, chunk: int
             ) -> list[tuple[Rows, ...]]:
    """The forwards of a run: per forward, each sequence's rows (seq id, start, count)."""
    seqs = numbered(transcripts)
    steps: list[tuple[Rows, ...]] = []
    if arm.rebatch:
        steps += _shared_prefill(seqs, chunk)
    else:
        for seq, t in seqs:
            cuts = [0, t.prompt]
            if arm.split is not None:
                cuts.insert(1, min(t.prompt - 1, max(1, round(arm.split * t.prompt))))
            for a, b in pairwise(cuts):
                steps += [(Rows(seq, s, min(chunk, b - s)),) for s in range(a, b, chunk)]
    order = list(reversed(seqs)) if arm.rebatch else seqs
    longest = max(len(t.ids) - t.prompt for _, t in seqs)
    for j in range(longest):
        step = tuple(Rows(seq, t.prompt + j, 1) for seq, t in order if t.prompt + j < len(t.ids))
        steps.append(step)
    return steps


def _shared_prefill(seqs: Sequence[tuple[int, Transcript]], chunk: int
                    ) -> list[tuple[Rows, ...]]:
    """Prefill forwards of a FCFS budget of `chunk` tokens, the chunked request first."""
    done = {seq: 0 for seq, _ in seqs}
    steps = []
    while any(done[s] < t.prompt for s, t in seqs):
        budget, rows = chunk, []
        for seq, t in seqs:
            if budget <= 0:
                break
            left = t.prompt - done[seq]
            if left <= 0:
                continue
            n = min(left, budget)
            rows.append(Rows(seq, done[seq], n))
            done[seq] += n
            budget -= n
        steps.append(tuple(rows))
    return steps


def run(model: torch.nn.Module, transcripts: Sequence[Transcript],
        steps: Sequence[tuple[Rows, ...]], recorder: Recorder | None = None) -> dict[int, Any]:
    """Run the forwards of `steps` (`schedule`) with one cache per sequence; every forward's
    rows go through the head (the logits are a site too). Returns each sequence's cache as it
    was when its prompt was complete (a fork: the cold prefill's state)."""
    by_seq = dict(numbered(transcripts))
    caches = {seq: model.new_cache() for seq in by_seq}
    prompt_end: dict[int, Any] = {}
    device = model.embed.weight.device
    with torch.inference_mode():
        for rows in steps:
            chunks = [(torch.tensor(by_seq[r.seq].ids[r.start:r.start + r.n], device=device),
                       caches[r.seq]) for r in rows]
            if recorder is None:
                model.logits(model.forward_ragged(chunks))
            else:
                with recorder.forward(rows):
                    model.logits(model.forward_ragged(chunks))
            for r in rows:
                if r.start + r.n == by_seq[r.seq].prompt:
                    prompt_end[r.seq] = caches[r.seq].fork()
    return prompt_end
