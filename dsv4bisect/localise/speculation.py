"""Speculative rounds against greedy decoding: which draft/verify step emitted what the main
model would not have.

Greedy speculative decoding must emit exactly the main model's own greedy tokens: in a round,
the accepted drafts are the main model's argmax at their rows, the round's last token is the
argmax after them, and nothing else ends the request. A fault of the round (`draft-eos`: the
stop check reads the drafts; a verify that accepts a draft the argmax rejects) shows as a round
whose emitted tokens differ from that rule applied to the same verify rows. The scheduler's
own speculative decode step runs (`reference/spec_decode.py`); a subclass of its `Scheduler`
records each round's drafts, the main model's argmax per verify row and the tokens the
configuration chose (`choose_verdict`, a public method the decode step calls), so the check
needs one generation per prompt, of the bad end only: the reference rule is computed on its own
verify rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsv4bisect.reference.request import Request
from dsv4bisect.reference.scheduler import Scheduler


@dataclass(frozen=True)
class Round:
    case_id: str
    index: int  # the round's number in its request
    emitted_before: int  # output tokens the request had before the round
    drafts: tuple[int, ...]
    argmax: tuple[int, ...]  # the main model's token at each verify row
    chosen: tuple[int, ...]  # the tokens the configuration took from the round
    greedy: tuple[int, ...]  # the tokens greedy decoding takes from the same rows
    stop_ids: frozenset[int]

    @property
    def op(self) -> str:
        """Which part of the round took the wrong tokens: the stop check (a stop id ended the
        request that greedy decoding did not end there), else the verification."""
        ended = bool(self.chosen) and self.chosen[-1] in self.stop_ids
        if ended and self.chosen[-1] not in self.greedy[:len(self.chosen)]:
            return "spec.stop_check"
        return "spec.verify"

    def to_dict(self) -> dict[str, Any]:
        return {"case_id": self.case_id, "round": self.index, "position": self.emitted_before,
                "drafts": list(self.drafts), "verify_argmax": list(self.argmax),
                "chosen": list(self.chosen), "greedy": list(self.greedy), "op": self.op}


def greedy_tokens(drafts: Sequence[int], argmax: Sequence[int]) -> tuple[int, ...]:
    """What greedy verification takes: drafts while each equals the argmax at its row, then the
    argmax at the first row that rejects (or after the last draft)."""
    out = []
    for d, a in zip(drafts, argmax, strict=False):
        out.append(a)
        if a != d:
            return tuple(out)
    return (*out, argmax[len(drafts)])


class _Recording(Scheduler):
    """The scheduler, recording each speculative round's verdict."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rounds: list[tuple[Request, tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []

    def choose_verdict(self, r: Request, drafts: list[int], rows: torch.Tensor) -> Any:
        verdict = super().choose_verdict(r, drafts, rows)
        argmax = tuple(int(x) for x in torch.argmax(rows, -1))
        self.rounds.append((r, tuple(drafts), argmax, tuple(verdict.tokens)))
        return verdict


def first_wrong_round(engine: Any, prompts: Iterable[tuple[str, tuple[int, ...], int]], *,
                      chunk: int, spec: Any, stop_ids: frozenset[int]
                      ) -> tuple[Round | None, int]:
    """Generate each (case id, prompt, max new tokens) with speculation, greedily, until a round
    emits what greedy decoding would not; that round (None if none did) and the prompts run."""
    tried = 0
    for case_id, ids, max_new in prompts:
        tried += 1
        sched = _Recording(engine, chunk_size=chunk, background=False, spec=spec)
        req = Request(tuple(ids), max_new, stop_ids)
        sched.submit(req)
        while not req.done.is_set():
            sched.step()
        sched.stop()
        emitted = 0
        for i, (_, drafts, argmax, chosen) in enumerate(sched.rounds):
            greedy = greedy_tokens(drafts, argmax)
            if chosen != greedy:
                return Round(case_id, i, emitted, drafts, argmax, chosen, greedy,
                             stop_ids), tried
            emitted += len(chosen)
    return None, tried
