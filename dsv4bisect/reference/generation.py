"""One greedy generation or scoring request on the engine, with SGLang's semantics.

This is the part of the server that touches the engine: it serializes model work with a lock (the
engine is not thread-safe), applies stop strings, and collects input and output log-probs the way
SGLang's scheduler reports them (`logprob_start_len`: the first reported input position has no
log-prob; -1 means output only). Endpoints (`reference/api.py`) turn a `GenOutput` into JSON.

Cancellation (`reference/cancel.py`): inside `stop_when(check)`, `run` polls `check` while it
waits for the engine and between model steps, and raises `Cancelled` once it is true.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsv4bisect.reference.cancel import Cancelled, StopCheck, current_check
from dsv4bisect.reference.tokenizer import EOS_ID, ByteTokenizer

TopList = list[tuple[int, float]]  # (token id, log-prob), best first


@dataclass(frozen=True)
class GenSpec:
    """What to compute for one prompt."""

    input_ids: tuple[int, ...]
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    return_logprob: bool = False
    logprob_start_len: int = -1  # SGLang: -1 = output only (start at the last prompt token)
    top_logprobs_num: int = 0
    token_ids_logprob: tuple[int, ...] | None = None


@dataclass(frozen=True)
class GenOutput:
    output_ids: list[int]
    text: str
    finish_reason: dict[str, Any]  # {"type": "stop", "matched": id|str} | {"type": "length", ...}
    output_logprobs: list[float | None]
    output_top: list[TopList]
    input_ids: list[int]  # the prompt positions that input log-probs cover
    input_logprobs: list[float | None]  # first entry None, as SGLang reports it
    input_top: list[TopList | None]


LOCK_POLL_S = 0.05  # how often a request queued behind another re-checks its stop condition


def finite(x: float) -> float | None:
    """JSON has no infinities; SGLang's orjson writes them as null."""
    return x if math.isfinite(x) else None


class Generator:
    """Runs `GenSpec`s on one engine, one at a time."""

    def __init__(self, engine: Any, tokenizer: ByteTokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.lock = threading.Lock()

    def run(self, spec: GenSpec) -> GenOutput:
        ids = list(spec.input_ids)
        start = len(ids) - 1 if spec.logprob_start_len == -1 else spec.logprob_start_len
        want_all = spec.token_ids_logprob is not None
        k = self.tokenizer.vocab_size if want_all else min(spec.top_logprobs_num,
                                                            self.tokenizer.vocab_size)
        stop_ids = tuple(spec.stop_token_ids) + (() if spec.ignore_eos else (EOS_ID,))
        scores, gen = [], None
        check = current_check()
        self._acquire(check)
        try:
            if spec.return_logprob and start + 1 < len(ids):
                scores = self.engine.score(ids, start=start + 1, top_logprobs=k,
                                           should_stop=check)
            if spec.max_new_tokens > 0:
                gen = self.engine.generate(
                    ids, max_new_tokens=spec.max_new_tokens, stop_ids=stop_ids, top_logprobs=k,
                    should_stop=check,
                )
        finally:
            self.lock.release()
        out_ids = list(gen.output_ids) if gen else []
        out_lp = [finite(x) for x in gen.logprobs] if gen else []
        out_top = [list(t) for t in gen.top_logprobs] if gen and k else [[] for _ in out_ids]
        cut = self._stop_cut(spec, out_ids)
        if cut is not None:
            out_ids, out_lp, out_top = out_ids[:cut], out_lp[:cut], out_top[:cut]
        text = self._decoded(spec, out_ids)
        finish = self._finish(spec, gen, out_ids, text, stopped_by_string=cut is not None)
        if isinstance(finish.get("matched"), str) and not spec.no_stop_trim:
            text = text[: text.find(finish["matched"])]
        in_lp: list[float | None] = [None] + [finite(s.logprob) for s in scores]
        in_top: list[TopList | None] = [None] + [list(s.top) for s in scores]
        return GenOutput(out_ids, text, finish, out_lp, out_top, ids[start:], in_lp, in_top)

    def _acquire(self, check: StopCheck | None) -> None:
        """Take the engine; a request whose client left while it queued never runs."""
        if check is None:
            self.lock.acquire()
            return
        while not self.lock.acquire(timeout=LOCK_POLL_S):
            if check():
                raise Cancelled
        if check():
            self.lock.release()
            raise Cancelled

    @staticmethod
    def _finish(
        spec: GenSpec, gen: Any, out_ids: list[int], text: str, *, stopped_by_string: bool
    ) -> dict[str, Any]:
        if stopped_by_string:
            found = [s for s in spec.stop if s and s in text]
            return {"type": "stop", "matched": min(found, key=lambda s: text.index(s) + len(s))}
        if gen is not None and gen.finish_reason == "stop" and out_ids:
            return {"type": "stop", "matched": out_ids[-1]}
        return {"type": "length", "length": len(out_ids)}

    def _decoded(self, spec: GenSpec, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=spec.skip_special_tokens)

    def _stop_cut(self, spec: GenSpec, out_ids: list[int]) -> int | None:
        """Fewest output tokens whose text contains a stop string (None if none does).

        Generation is greedy, so stopping after the fact gives exactly the tokens an engine that
        checked stop strings at every step would have produced.
        """
        stops = [s for s in spec.stop if s]
        if not stops or not any(s in self._decoded(spec, out_ids) for s in stops):
            return None
        lo, hi = 1, len(out_ids)  # invariant: the answer is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in self._decoded(spec, out_ids[:mid]) for s in stops):
                hi = mid
            else:
                lo = mid + 1
        return lo
