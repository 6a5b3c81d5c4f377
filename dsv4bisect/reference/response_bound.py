"""How many log-prob entries one request may make the server hold, and all requests at once.

A request's cost in memory is not its body: a 77 KB `/generate` with the whole prompt scored
(`logprob_start_len` 0) and `top_logprobs_num` 512 asks for 16 k positions × 513 entries: the
audit saw a 249 MB JSON reply and the server's RSS peak at 2.85 GB. What a request makes the server
hold is its log-prob entries: per scored position (prompt positions from `logprob_start_len`,
and every output token) the chosen token's plus `k` alternatives, where k is `top_logprobs_num`,
or the whole vocabulary when `token_ids_logprob` is asked (the engine ranks every id to look
them up). Measured on the embedded engine (docs/reliability.md): 360-500 bytes of peak RSS per
entry (the engine's rows, the reply's lists, its JSON), 31 bytes of JSON.

SGLang bounds none of this in the reply: its only limits are on the computation
(`SGLANG_LOGPROB_CHUNK_SIZE`, 2048 rows of the LM head at a time) and, with prefill-decode
disaggregation, `top_logprobs_num` <= 128 (the transfer buffer's width). Here:
- one request (all its prompts, for a batched `/generate` or `/v1/completions`) may ask for at
  most MAX_ENTRIES_PER_REQUEST entries: beyond, 400 with the sizes and what to lower. The probe
  asks for at most drift_window × (1 + drift_top_k): 4096 × 21 = 86 016 by default, 688 128 for
  a whole 32 k context at top-k 20;
- all requests in flight together at most MAX_ENTRIES_IN_FLIGHT (four of the largest): a
  request that would go beyond is 503 at once, as the server answers when 64 requests are in
  flight, and its client retries. A request holds its entries from its check until its
  handler returned (the JSON is then encoded on the event loop, one reply at a time).

The count lives in the request's context (`request_scope`, opened by the HTTP layer around a
handler), as the stop check does (`cancel.py`); model work outside one (a hot switch's warm-up,
`/health_generate`) is checked against the per-request bound only. Torch-free.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from dsv4bisect.reference.request_body import ApiError

MAX_ENTRIES_PER_REQUEST = 1 << 20  # 31 MiB of JSON; ~0.4 GB peak RSS on the embedded engine
MAX_ENTRIES_IN_FLIGHT = 4 * MAX_ENTRIES_PER_REQUEST


def logprob_entries(*, scored_positions: int, output_tokens: int, k: int) -> int:
    """Entries a request's log-probs hold: per scored position and output token, the chosen
    token's and k alternatives."""
    return (scored_positions + output_tokens) * (1 + k)


@dataclass
class _Request:
    entries: int = 0


class _InFlight:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries = 0

    def take(self, n: int) -> bool:
        with self._lock:
            if self.entries + n > MAX_ENTRIES_IN_FLIGHT:
                return False
            self.entries += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.entries -= n


IN_FLIGHT = _InFlight()
_current: ContextVar[_Request | None] = ContextVar("logprob_entries", default=None)


@contextmanager
def request_scope() -> Iterator[None]:
    """One HTTP request: what `charge` takes inside is held until the block ends."""
    request = _Request()
    token = _current.set(request)
    try:
        yield
    finally:
        _current.reset(token)
        IN_FLIGHT.give(request.entries)


def charge(entries: int) -> None:
    """Take `entries` for the current request, or refuse it: ApiError 400 beyond the
    per-request bound, 503 when the requests in flight hold too many already."""
    request = _current.get()
    total = entries + (0 if request is None else request.entries)
    if total > MAX_ENTRIES_PER_REQUEST:
        raise ApiError(
            f"the log-probs asked for would hold {total} entries (scored positions × "
            f"(1 + top_logprobs_num), or × the vocabulary with token_ids_logprob); this server "
            f"returns at most {MAX_ENTRIES_PER_REQUEST} per request: raise logprob_start_len, "
            "lower top_logprobs_num or split the request")
    if request is None or entries == 0:
        return
    if not IN_FLIGHT.take(entries):
        raise ApiError(f"the server is busy: the requests in flight hold {IN_FLIGHT.entries} "
                       f"log-prob entries of {MAX_ENTRIES_IN_FLIGHT}; retry shortly", 503,
                       "ServiceUnavailableError")
    request.entries += entries
