"""One generation (greedy or sampled) or scoring request on the engine, with SGLang's semantics.

This is the part of the server that touches the engine: `run` hands a request to the scheduler
(`reference/scheduler.py`: continuous batching and the prefix cache) and waits for it, so it is
blocking and may be called from many threads at once. It applies stop strings and collects input
and output log-probs the way SGLang's scheduler reports them (`logprob_start_len`: the first
reported input position has no log-prob; -1 means output only). Endpoints (`reference/api.py`)
turn a `GenOutput` into JSON.

Cancellation (`reference/cancel.py`): inside `stop_when(check)`, `run` polls `check` while it
waits; once it is true `run` raises `Cancelled` and the request leaves its batch at the next
step.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4bisect.reference.cancel import Cancelled, StopCheck, current_check
from dsv4bisect.reference.response_bound import charge, logprob_entries
from dsv4bisect.reference.tokenizer import EOS_ID, ByteTokenizer

if TYPE_CHECKING:  # the scheduler imports torch; this module stays importable without it
    from dsv4bisect.reference.request import Request

TopList = list[tuple[int, float]]  # (token id, log-prob), best first
# SGLang's `FAKE_BOOTSTRAP_HOST` (disaggregation/utils.py): a PD server's own health check runs
# with it and transfers nothing
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


@dataclass(frozen=True)
class Bootstrap:
    """Where a PD request's state goes (SGLang's `bootstrap_host`, `bootstrap_port`,
    `bootstrap_room`, which the router adds): the prefill server's bootstrap address and the
    room both servers name the request by (reference/pd/)."""

    host: str
    port: int
    room: int

    @property
    def fake(self) -> bool:
        return self.host == FAKE_BOOTSTRAP_HOST


FAKE_BOOTSTRAP = Bootstrap(FAKE_BOOTSTRAP_HOST, 0, 0)


@dataclass(frozen=True)
class FirstToken:
    """A PD request's first output token as the prefill server chose it (SGLang sends it with
    its log-probs in the transfer's metadata), and the prompt tokens its prefix cache gave."""

    token: int
    logprob: float
    top: TopList
    cached_tokens: int = 0


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
    # SGLang's sampling parameters (reference/sampling.py); temperature 0 is greedy
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    bootstrap: Bootstrap | None = None  # a PD request (None: an ordinary one)


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
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied (SGLang's cached_tokens)
    # False: a streamed snapshot (`Generator.stream`): the tokens and text so far that the
    # final answer is sure to begin with; finish_reason {} until the final one
    final: bool = True


POLL_S = 0.05  # how often a waiting request re-checks its stop condition


def finite(x: float) -> float | None:
    """JSON has no infinities; SGLang's orjson writes them as null."""
    return x if math.isfinite(x) else None


class Generator:
    """Runs `GenSpec`s on one engine through its scheduler; `run` is thread-safe."""

    def __init__(
        self, engine: Any, tokenizer: ByteTokenizer, *, max_running_requests: int | None = None,
        radix_cache: bool = True, chunk_size: int | None = None, spec: Any = None,
        prefix_cache_budget: int | None = None,
    ) -> None:
        from dsv4bisect.reference.prefix_cache import DEFAULT_BUDGET_BYTES, PrefixCache
        from dsv4bisect.reference.scheduler import Scheduler

        self.engine = engine
        self.tokenizer = tokenizer
        self.prefix_cache = (PrefixCache(prefix_cache_budget or DEFAULT_BUDGET_BYTES)
                             if radix_cache else None)
        self.scheduler = Scheduler(engine, chunk_size=chunk_size,
                                   max_running_requests=max_running_requests,
                                   prefix_cache=self.prefix_cache, spec=spec)

    def run(self, spec: GenSpec) -> GenOutput:
        return self.run_request(spec)[0]

    def run_request(self, spec: GenSpec, *, keep_cache: bool = False
                    ) -> tuple[GenOutput, Request]:
        """`run`, also returning the request; `keep_cache`: its decoding state stays on it
        once it has left (a PD prefill server transfers it)."""
        req = self._request(spec, keep_cache=keep_cache)
        if spec.max_new_tokens > 0 or req.score_from is not None:
            self._wait(req, current_check())
        return self._output(spec, req), req

    def resume(self, spec: GenSpec, cache: Any, first: FirstToken) -> tuple[GenOutput, Request]:
        """Decode `spec` from a transferred state (a PD decode server): `cache` holds the prompt,
        `first` is the token the prefill server chose. The output reports no input log-probs
        (the prefill server's response has them; the router joins the two, as SGLang's)."""
        req = self._request(spec, keep_cache=True, inputs=False)
        req.cache, req.filled, req.cached_tokens = cache, req.target, first.cached_tokens
        if spec.max_new_tokens > 0 and not self.scheduler.start(req, first.token,
                                                                first.logprob, first.top):
            self._wait(req, current_check())
        return self._output(spec, req, inputs=False), req

    def stream(self, spec: GenSpec) -> Iterator[GenOutput]:
        """`run`, showing the answer as it grows (reference/stream_api.py sends it as SSE).

        The request is checked here (a bad one raises before anything is yielded); the
        iterator then yields a snapshot (`final=False`) whenever more of the answer is sure, and
        last the very output `run` returns. A snapshot holds back what a later token could still
        change: a partial UTF-8 character, or text that could begin a stop string (stop
        strings apply to the whole answer, as in `run`: the text stops there and the request
        runs on to its end, so the engine does exactly what an unstreamed request does)."""
        req = self._request(spec)
        return self._follow(spec, req, current_check())

    def _request(self, spec: GenSpec, *, keep_cache: bool = False, inputs: bool = True
                 ) -> Request:
        """The checked request; `inputs` False: its prompt's log-probs are not returned (a PD
        decode server's), so they are not charged against the response bound."""
        from dsv4bisect.reference.request import Request
        from dsv4bisect.reference.sampling import Sampling

        ids = list(spec.input_ids)
        start = self._start(spec)
        want_all = spec.token_ids_logprob is not None
        k = self.tokenizer.vocab_size if want_all else min(spec.top_logprobs_num,
                                                            self.tokenizer.vocab_size)
        stop_ids = tuple(spec.stop_token_ids) + (() if spec.ignore_eos else (EOS_ID,))
        self.engine.check_request(ids, spec.max_new_tokens, k, stop_ids)
        score_from = start + 1 if spec.return_logprob and start + 1 < len(ids) else None
        if spec.return_logprob:  # what the reply will hold, against the server's bounds
            scored = len(ids) - (score_from or len(ids)) if inputs else 0
            charge(logprob_entries(scored_positions=scored, output_tokens=spec.max_new_tokens,
                                   k=k))
        return Request(tuple(ids), spec.max_new_tokens, frozenset(stop_ids), k, score_from,
                       Sampling(spec.temperature, spec.top_p, spec.top_k, spec.seed),
                       keep_cache=keep_cache)

    @staticmethod
    def _start(spec: GenSpec) -> int:
        n = len(spec.input_ids)
        return n - 1 if spec.logprob_start_len == -1 else spec.logprob_start_len

    def _output(self, spec: GenSpec, req: Request, *, inputs: bool = True) -> GenOutput:
        """The request's answer; `inputs` False: no input log-probs (a PD decode server's)."""
        ids = list(spec.input_ids)
        start = self._start(spec)
        out_ids = list(req.output_ids)
        out_lp = [finite(x) for x in req.logprobs]
        out_top = [list(t) for t in req.tops] if req.top_k else [[] for _ in out_ids]
        cut = self._stop_cut(spec, out_ids)
        if cut is not None:
            out_ids, out_lp, out_top = out_ids[:cut], out_lp[:cut], out_top[:cut]
        text = self._decoded(spec, out_ids)
        finish = self._finish(spec, req, out_ids, text, stopped_by_string=cut is not None)
        if isinstance(finish.get("matched"), str) and not spec.no_stop_trim:
            text = text[: text.find(finish["matched"])]
        if not inputs:
            return GenOutput(out_ids, text, finish, out_lp, out_top, [], [], [],
                             req.cached_tokens)
        in_lp: list[float | None] = [None] + [finite(s.logprob) for s in req.scores]
        in_top: list[TopList | None] = [None] + [list(s.top) for s in req.scores]
        return GenOutput(out_ids, text, finish, out_lp, out_top, ids[start:], in_lp, in_top,
                         req.cached_tokens)

    def _follow(self, spec: GenSpec, req: Request, check: StopCheck | None
                ) -> Iterator[GenOutput]:
        if spec.max_new_tokens == 0 and req.score_from is None:
            yield self._output(spec, req)
            return
        grew = threading.Event()
        req.on_token = grew.set  # the scheduler calls it after each token it appends
        if check is not None and check():
            raise Cancelled
        self.scheduler.submit(req)
        shown = 0
        while not req.done.is_set():
            grew.wait(POLL_S)
            grew.clear()
            if check is not None and check():
                self.scheduler.cancel(req)
                raise Cancelled
            n = self._sure(spec, req.output_ids[:len(req.tops)])
            if n > shown:
                shown = n
                yield self._snapshot(spec, req, n)
        if req.error is not None:
            raise req.error
        yield self._output(spec, req)

    def _sure(self, spec: GenSpec, ids: list[int]) -> int:
        """How many of `ids` the final answer surely begins with, text and all: none past a
        stop string's start, a partial UTF-8 character or a tail that could begin a stop
        string."""
        stops = [s for s in spec.stop if s]
        n = len(ids)
        if stops and any(s in self._decoded(spec, ids) for s in stops):
            n = (self._stop_cut(spec, ids) or n) - 1  # the token completing it: not yet
        while n > 0:
            text = self._decoded(spec, ids[:n])
            if not text.endswith("\ufffd") and not any(
                    text.endswith(s[:k]) for s in stops for k in range(1, len(s))) \
                    and not any(s in text for s in stops):
                return n
            n -= 1
        return 0

    def _snapshot(self, spec: GenSpec, req: Request, n: int) -> GenOutput:
        """The first `n` output tokens (with their log-probs) and their text, not final."""
        ids = list(spec.input_ids)
        out_ids = list(req.output_ids[:n])
        out_top = [list(t) for t in req.tops[:n]] if req.top_k else [[] for _ in out_ids]
        in_lp: list[float | None] = [None] + [finite(s.logprob) for s in req.scores]
        in_top: list[TopList | None] = [None] + [list(s.top) for s in req.scores]
        return GenOutput(out_ids, self._decoded(spec, out_ids), {},
                         [finite(x) for x in req.logprobs[:n]], out_top,
                         ids[self._start(spec):], in_lp, in_top, req.cached_tokens, final=False)

    def _wait(self, req: Request, check: StopCheck | None) -> None:
        """Queue the request and wait for it; a caller whose client left stops waiting and the
        request leaves its batch at the next step."""
        if check is not None and check():
            raise Cancelled
        self.scheduler.submit(req)
        if check is None:
            req.done.wait()
        else:
            while not req.done.wait(POLL_S):
                if check():
                    self.scheduler.cancel(req)
                    raise Cancelled
        if req.error is not None:
            raise req.error

    @contextmanager
    def drained(self) -> Iterator[None]:
        """No request runs inside (new ones wait); the prefix cache is emptied on entry."""
        with self.scheduler.drained():
            yield

    def flush_cache(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.flush()

    def stats(self) -> dict[str, Any]:
        return self.scheduler.stats()

    @staticmethod
    def _finish(
        spec: GenSpec, req: Request, out_ids: list[int], text: str, *, stopped_by_string: bool
    ) -> dict[str, Any]:
        if stopped_by_string:
            found = [s for s in spec.stop if s and s in text]
            return {"type": "stop", "matched": min(found, key=lambda s: text.index(s) + len(s))}
        if req.finish_reason == "stop" and out_ids:
            return {"type": "stop", "matched": out_ids[-1]}
        return {"type": "length", "length": len(out_ids)}

    def _decoded(self, spec: GenSpec, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=spec.skip_special_tokens)

    def _stop_cut(self, spec: GenSpec, out_ids: list[int]) -> int | None:
        """Fewest output tokens whose text contains a stop string (None if none does).

        A token never depends on later ones (greedy, or drawn from the request's seeded stream),
        so stopping after the fact gives exactly the tokens an engine that checked stop strings
        at every step would have produced.
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
