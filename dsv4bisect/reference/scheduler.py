"""Continuous batching for the embedded engine, after SGLang's scheduler.

Requests queue; one thread runs steps. A step is, as in SGLang's `Scheduler.get_next_batch_to_run`
(`managers/scheduler.py`) with `--enable-mixed-chunk` off (its default):
- a prefill (extend) batch when there is prefill work: `PrefillAdder` (`managers/schedule_policy.py`)
  first continues the chunked request (the one whose prompt did not fit the last step), then
  takes waiting requests in arrival order (SGLang's `fcfs` policy) while the token budget
  `chunk_size` (SGLang's `chunked_prefill_size`) lasts and fewer than `max_running_requests`
  would be running; the request that does not fit is split, runs its first part now and becomes
  the chunked request (one at a time);
- else a decode batch: one token for every running request.
Each batch is one ragged forward (`Transformer.forward_ragged`): token-wise ops over all rows at
once, attention per request against its own cache. A request's last prefill chunk yields its
first output token (greedy), as SGLang's extend batch samples; then it decodes until a stop id or
`max_new_tokens`. Teacher-forced scoring (input log-probs) is prefill work: the rows of the
scored positions are kept.

Prefix cache (`prefix_cache.py`): at admission a request takes the longest cached snapshot of a
prefix of its prompt (leaving at least one token to compute, and no later than its first scored
position, as SGLang limits the match by `logprob_start_len`), and prefills only the rest. A
snapshot is inserted when a prompt is complete (with the logits of its last position) and when a
request finishes. The same prompt sent again to generate (a retry, a regenerate) is a whole hit:
SGLang recomputes its last token from per-token KV; a snapshot cannot be cut back by one token, so
here the request resumes at the prompt's end and takes its first token from the kept logits (no
forward: the prefill batch carries it with 0 tokens).

Where this differs from SGLang: no memory-pool admission (`rem_total_tokens`), retraction or
`new_token_ratio` (the caches are Python objects; `max_running_requests` is the only cap); a
split ends exactly at the budget (SGLang rounds it down to a page, 256 tokens for V4); no
`lpm` policy (SGLang's default is `fcfs` too); prefix matching is by snapshot, not per page
(see prefix_cache.py); no overlap scheduler; `peak_running_requests` counts the requests of
the largest batch (prefill or decode) run so far.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import accumulate
from typing import Any

import torch

from dsv4bisect.reference import heap
from dsv4bisect.reference.cache import ModelCache
from dsv4bisect.reference.cancel import Cancelled
from dsv4bisect.reference.engine import TokenScore, single_thread, top_alternatives
from dsv4bisect.reference.mtp import feed_mtp
from dsv4bisect.reference.prefix_cache import PrefixCache
from dsv4bisect.reference.request import Request
from dsv4bisect.reference.sampling import draw
from dsv4bisect.reference.spec_decode import spec_decode
from dsv4bisect.reference.spec_settings import SpecSettings
from dsv4bisect.reference.speculative import Verdict, spec_metrics

log = logging.getLogger(__name__)

# SGLang's DeepSeek-V4 default (`apply_deepseek_v4_defaults`: max_running_requests None -> 256);
# a decode batch of this many requests is still milliseconds per row on the tiny models.
DEFAULT_MAX_RUNNING_REQUESTS = 256


class Scheduler:
    def __init__(
        self, engine: Any, *, chunk_size: int | None = None,
        max_running_requests: int | None = None, prefix_cache: PrefixCache | None = None,
        background: bool = True, spec: SpecSettings | None = None,
    ) -> None:
        self.engine, self.model = engine, engine.model
        self.chunk_size = chunk_size or engine.chunk_size
        self.max_running = max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS
        if self.chunk_size <= 0 or self.max_running <= 0:
            raise ValueError("chunk_size and max_running_requests must be positive")
        self.prefix_cache = prefix_cache
        if spec is not None and not len(self.model.mtp):
            raise ValueError("speculative decoding needs a model loaded with its MTP layer")
        self.spec = spec  # None: one token per decode step
        # where the sliding window's rows live, one store per kind the model's patch sets
        # have asked for (`Op.WINDOW_STORE`; a hot switch may change the kind, not the store)
        self._window_stores: dict[Any, Any] = {}
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._chunked: Request | None = None
        self._running: list[Request] = []
        self._hold = 0  # drains in progress: no new request is admitted
        self._step_lock = threading.Lock()  # held while a step uses the model
        self._thread: threading.Thread | None = None
        self._background = background
        self._stopped = False
        self.totals = {"prefix_cache_hit_tokens": 0, "prefill_tokens_computed": 0,
                       "peak_running_requests": 0, "prefill_batches": 0, "decode_batches": 0,
                       "finished_requests": 0, "generated_tokens": 0,
                       # per request: forwards of the main model that emitted tokens, and those
                       # tokens (their ratio is the main-model forwards per output token)
                       "main_forwards": 0, "output_tokens": 0,
                       "spec_verify_forwards": 0, "spec_proposed_drafts": 0,
                       "spec_accepted_drafts": 0, "spec_emitted_tokens": 0}

    # ---- the callers' side ---------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        with self._cond:
            if self._stopped:
                raise RuntimeError("the scheduler is stopped")
            self._waiting.append(req)
            if self._thread is None and self._background:
                self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
                self._thread.start()
                # at interpreter exit, let a step in flight end before torch is torn down
                atexit.register(self.stop)
            self._cond.notify_all()

    def cancel(self, req: Request) -> None:
        with self._cond:
            req.cancelled = True
            self._cond.notify_all()

    def stop(self) -> None:
        """Fail what is queued, let a step in flight finish, end the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            t = self.totals
            return dict(t) | spec_metrics(t) | {
                "running_requests": len(self._running) + (self._chunked is not None),
                "waiting_requests": len(self._waiting),
                "prefix_cache_entries": 0 if self.prefix_cache is None else len(self.prefix_cache),
                "prefix_cache_bytes": 0 if self.prefix_cache is None else self.prefix_cache.nbytes,
                "prefix_cache_budget_bytes": (0 if self.prefix_cache is None
                                              else self.prefix_cache.budget),
            }

    @contextmanager
    def drained(self) -> Iterator[None]:
        """Hold new requests, wait for the running ones to finish, empty the prefix cache; the
        model is the caller's inside the block (a hot switch runs here)."""
        with self._cond:
            self._hold += 1
            self._cond.notify_all()
            while self._running or self._chunked is not None:
                self._cond.wait()
        try:
            with self._step_lock:
                if self.prefix_cache is not None:
                    self.prefix_cache.flush()
                yield
        finally:
            with self._cond:
                self._hold -= 1
                self._cond.notify_all()

    # ---- the scheduler thread ------------------------------------------------------------------
    def step(self) -> tuple[str, list[tuple[Request, int]]] | None:
        """Run one step in the calling thread and return it ((kind, [(request, tokens)]), None
        when there was no work). For a scheduler built with `background=False` (tests drive it
        step by step); the background thread runs exactly this."""
        with self._cond:
            batch = self._next_batch()
        if batch is not None:
            with torch.inference_mode():
                self._run(*batch)
        return batch

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    batch = self._next_batch()
                    if batch is None:  # idle: the steps' activations are all freed
                        heap.give_back()
                    while batch is None and not self._stopped:
                        self._cond.wait()
                        batch = self._next_batch()
                    if self._stopped:
                        self._fail_all(RuntimeError("the scheduler stopped"))
                        return
                self._run(*batch)

    def _run(self, kind: str, work: list[tuple[Request, int]]) -> None:
        try:
            with self._step_lock:
                finished = self._prefill(work) if kind == "prefill" else self._decode(work)
        except Exception as exc:  # a bug or a bad input: fail the batch, keep serving
            log.exception("%s batch failed", kind)
            with self._cond:
                for r, _ in work:
                    self._leave(r, exc)
                self._cond.notify_all()
            return
        with self._cond:
            for r in finished:
                self._leave(r, None)
            if kind == "prefill":
                self._running += [r for r, _ in work if r.filled == r.target
                                  and not r.done.is_set() and r not in self._running]
            self._cond.notify_all()

    def _next_batch(self) -> tuple[str, Any] | None:
        """Under the lock: drop cancelled requests, then a prefill batch, else a decode one."""
        for r in [*self._waiting, *self._running, *([self._chunked] if self._chunked else [])]:
            if r.cancelled:
                self._leave(r, Cancelled())
        prefill = self._prefill_batch()
        if prefill:
            return "prefill", prefill
        if self._running:
            return "decode", [(r, 1) for r in self._running]
        return None

    def _prefill_batch(self) -> list[tuple[Request, int]]:
        """SGLang's PrefillAdder: the chunked request first, then FCFS within the budget."""
        if len(self._running) >= self.max_running and self._chunked is None:
            return []
        budget, out = self.chunk_size, []
        if self._chunked is not None:
            req, self._chunked = self._chunked, None
            n = min(req.remaining, budget)
            out.append((req, n))
            budget -= n
            if n < req.remaining:
                self._chunked = req
                return out
        while self._waiting and budget > 0 and not self._hold:
            if len(self._running) + len(out) >= self.max_running:
                break
            req = self._waiting.popleft()
            self._admit(req)
            n = min(req.remaining, budget)
            out.append((req, n))
            budget -= n
            if n < req.remaining:
                self._chunked = req
                break
        return out

    def _admit(self, req: Request) -> None:
        """Give the request its cache: a fork of the longest cached prefix, or a fresh one."""
        if not req.sampling.greedy:
            req.rng = req.sampling.generator(self.engine.device)
        if req.cache is not None:  # a PD decode server's request: its state came by transfer
            return
        match = None
        whole = req.score_from is None and req.max_new_tokens > 0  # may resume at the end
        if self.prefix_cache is not None and (req.match_limit > 0 or whole):
            match = self.prefix_cache.match(req.ids, req.match_limit, whole=whole)
        if match is not None and match.cache is not None:
            req.cache, req.filled = match.cache, match.tokens
            req.cached_tokens = match.tokens
            req.resume_logits = match.logits
            self.totals["prefix_cache_hit_tokens"] += match.tokens
        else:
            req.cache = self.model.new_cache(mtp=self.spec is not None)
        kind = self.model.window_store
        if kind not in self._window_stores:
            self._window_stores[kind] = kind(self.max_running, self.model.a.sliding_window)
        req.window = self._window_stores[kind].admit(req.cache, bool(req.cached_tokens))

    def _leave(self, req: Request, error: BaseException | None) -> None:
        """Under the lock: take the request out of every queue and wake its caller."""
        if req in self._waiting:
            self._waiting.remove(req)
        if req in self._running:
            self._running.remove(req)
        if self._chunked is req:
            self._chunked = None
        if req.window is not None:
            req.window.release(req.cache)
            req.window = None
        if error is None:
            self.totals["finished_requests"] += 1
            self.totals["generated_tokens"] += len(req.output_ids)
        req.error = error
        if not req.keep_cache:
            req.cache = None
        req.done.set()

    def _fail_all(self, error: BaseException) -> None:
        for r in [*self._waiting, *self._running, *([self._chunked] if self._chunked else [])]:
            self._leave(r, error)

    def _note_batch(self, size: int) -> None:
        with self._cond:
            self.totals["peak_running_requests"] = max(self.totals["peak_running_requests"], size)

    # ---- steps (model work, outside the queue lock) --------------------------------------------
    def _prefill(self, work: list[tuple[Request, int]]) -> list[Request]:
        """One extend batch. Returns the requests it finished. A whole-prompt hit (0 tokens)
        takes its first token from the logits its snapshot kept; a PD decode server's request
        arrives with its first token (the prefill server's) and only joins the running batch;
        the rest run one forward."""
        self._note_batch(len(work))
        resumed = [r for r, n in work if n == 0]
        work = [(r, n) for r, n in work if n > 0]
        done = [r for r in resumed if not r.output_ids and self.emit(r, r.resume_logits)]
        return done + (self._extend(work) if work else [])

    def _extend(self, work: list[tuple[Request, int]]) -> list[Request]:
        """The forward of an extend batch's requests that have tokens to compute."""
        device = self.engine.device
        chunks = [(torch.tensor(r.ids[r.filled : r.filled + n], device=device), r.cache)
                  for r, n in work]
        h = self.model.forward_ragged(chunks)  # [Σn, n_streams, dim]
        if self.spec is not None:  # the MTP layer reads every main row (mtp.feed_mtp)
            bounds = [0, *accumulate(n for _, n in work)]
            feed_mtp(self.model, [(h[a:b], t, c.mtp) for (t, c), a, b
                                  in zip(chunks, bounds, bounds[1:], strict=False)])
        rows: list[int] = []  # rows of h whose logits are needed, in order
        wants: list[tuple[Request, int, int, bool]] = []  # (req, first position, count, last)
        at = 0
        for r, n in work:
            start = r.filled  # this chunk's row j holds position start + j
            first = max((r.score_from or len(r.ids)) - 1 - start, 0)  # row predicting score_from
            last_scored = min(n, len(r.ids) - 1 - start)  # rows predicting ids[.. len - 1]
            count = max(last_scored - first, 0) if r.score_from is not None else 0
            rows += range(at + first, at + first + count)
            ends = start + n == r.target and r.max_new_tokens > 0
            if ends:
                rows.append(at + n - 1)
            wants.append((r, start + first, count, ends))
            at += n
        logits = self.model.logits(h[rows]) if rows else None  # [len(rows), V]
        done, at = [], 0
        with self._cond:
            self.totals["prefill_batches"] += 1
            self.totals["prefill_tokens_computed"] += sum(n for _, n in work)
        for (r, n), (_, pos, count, ends) in zip(work, wants, strict=True):
            if count:
                self._score(r, logits[at : at + count], pos)
                at += count
            r.filled += n
            if r.filled == r.target:  # a prompt that generates keeps its last logits with it
                self._remember(r.ids[: r.filled], r.cache, logits[at].clone() if ends else None)
                if not ends:  # scoring only
                    r.finish_reason = "length"
                    done.append(r)
                elif self._emit_forward(r, logits[at]):
                    done.append(r)
            if ends:
                at += 1
        return done

    def _decode(self, work: list[tuple[Request, int]]) -> list[Request]:
        """One token for every running request. Returns those that finished."""
        reqs = [r for r, _ in work]
        self._note_batch(len(reqs))
        device = self.engine.device
        if self.spec is not None:
            with single_thread():
                done = spec_decode(self, reqs)
            with self._cond:
                self.totals["decode_batches"] += 1
            return done
        with single_thread():
            h = self.model.forward_ragged(
                [(torch.tensor(r.output_ids[-1:], device=device), r.cache) for r in reqs])
            logits = self.model.logits(h)  # [R, V]
        with self._cond:
            self.totals["decode_batches"] += 1
        return [r for i, r in enumerate(reqs) if self._emit_forward(r, logits[i])]

    def _score(self, r: Request, logits: torch.Tensor, pos: int) -> None:
        """logits [c, V] of the rows predicting positions pos + 1 .. pos + c."""
        lp = torch.log_softmax(logits, -1)
        targets = torch.tensor(r.ids[pos + 1 : pos + 1 + logits.shape[0]], device=lp.device)
        chosen = lp.gather(1, targets[:, None])[:, 0].tolist()
        top = top_alternatives(logits, lp, r.top_k)
        for j, (t, v) in enumerate(zip(targets.tolist(), chosen, strict=True)):
            r.scores.append(TokenScore(pos + 1 + j, t, v, top[j]))

    def _emit_forward(self, r: Request, logits: torch.Tensor) -> bool:
        """A main-model forward's one token for `r` (prefill's last chunk, plain decode)."""
        with self._cond:
            self.totals["main_forwards"] += 1
        return self.emit(r, logits)

    def note_round(self, proposed: int, verdict: Verdict) -> None:
        """A speculative round of one request: one main forward, its drafts and acceptance."""
        with self._cond:
            t = self.totals
            t["main_forwards"] += 1
            t["spec_verify_forwards"] += 1
            t["spec_proposed_drafts"] += proposed
            t["spec_accepted_drafts"] += verdict.accepted
            t["spec_emitted_tokens"] += verdict.accepted + 1

    def choose_verdict(self, r: Request, drafts: list[int], rows: torch.Tensor) -> Verdict:
        """Verify one request's drafts against its verify rows' logits [1 + k, V]: the
        model's verification (`Op.SPEC_VERIFY`: greedy, or by rejection sampling from the
        request's sampling distribution, unless a patch swapped it)."""
        return self.model.spec_verify(r, drafts, rows)

    def emit(self, r: Request, logits: torch.Tensor, token: int | None = None) -> bool:
        """Append `token` (None: the request's choice from logits [V]: greedy, ties -> lowest
        id, or a draw) with its log-prob; True when the request is done."""
        lp = torch.log_softmax(logits, -1)
        if token is None:
            token = (int(torch.argmax(logits)) if r.sampling.greedy
                     else draw(r.sampling.probs(logits), r.rng))
        if not self._append(r, token, float(lp[token]),
                            top_alternatives(logits[None], lp[None], r.top_k)[0]):
            return False
        if len(r.output_ids) > 1:  # the state after the prompt and all but the last token
            self._remember(r.ids + tuple(r.output_ids[:-1]), r.cache)
        return True

    def start(self, r: Request, token: int, logprob: float,
              top: list[tuple[int, float]]) -> bool:
        """A PD decode server's request (its cache is the transferred prompt state, `filled` its
        prompt): record the first token the prefill server chose; True when that token ended
        it, else it is to be submitted and joins the decode batch."""
        return self._append(r, token, logprob, top)

    def _append(self, r: Request, token: int, logprob: float,
                top: list[tuple[int, float]]) -> bool:
        """Record one output token; True when it ends the request (stop id or length)."""
        with self._cond:
            self.totals["output_tokens"] += 1
        r.output_ids.append(token)
        r.logprobs.append(logprob)
        r.tops.append(top)
        if r.on_token is not None:  # a streamed answer
            r.on_token()
        if token in r.stop_ids:
            r.finish_reason = "stop"
        elif len(r.output_ids) == r.max_new_tokens:
            r.finish_reason = "length"
        else:
            return False
        return True

    def _remember(self, ids: tuple[int, ...], cache: ModelCache | None,
                  logits: torch.Tensor | None = None) -> None:
        if self.prefix_cache is not None and cache is not None:
            self.prefix_cache.insert(ids, cache, logits)
