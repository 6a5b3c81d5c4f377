"""A streamed chat answer as the probe reads it: the answer, and when its tokens came.

The probe asks for its scored answers as SGLang's users and its benchmark tools do (`"stream":
true`, `stream_options.include_usage`): server-sent events, one `data: <JSON>` per piece of
text, the usage in a last chunk with no choices, then `data: [DONE]`. `read_chat_stream`
turns them back into the unstreamed response's shape (so the client reads both one way) and
measures, as SGLang's `bench_serving` does: the time to first token (request sent → first
event with text) and the inter-token latency (the gaps between later events with text; an
event may carry more than one token, so this is per event, as there).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StreamTiming:
    ttft_s: float | None  # None: no text came (an empty answer)
    gaps_s: tuple[float, ...]  # between consecutive events with text

    @property
    def itl_s(self) -> float | None:
        return sum(self.gaps_s) / len(self.gaps_s) if self.gaps_s else None


class StreamError(ValueError):
    """The events do not make a chat answer (the caller words it as a malformed response)."""


def read_chat_stream(lines: Iterable[bytes], t0: float,
                     clock: Callable[[], float] = time.perf_counter
                     ) -> tuple[dict[str, Any], StreamTiming]:
    """(the answer as `/v1/chat/completions` sends it unstreamed, its timing) from the lines of
    an event stream; `t0`: when the request was sent (on `clock`)."""
    text: list[str] = []
    finish, usage, done = None, None, False
    stamps: list[float] = []
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").strip() if isinstance(raw, bytes) else raw
        if not line.startswith("data:"):
            continue  # blank separators, comments, `event:` lines
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            done = True
            break
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            raise StreamError(f"an event is not a JSON object: {payload[:80]}")
        if "error" in chunk or chunk.get("object") == "error":
            raise StreamError(f"the server sent an error event: {payload[:200]}")
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                text.append(str(piece))
                stamps.append(clock())
            finish = choice.get("finish_reason") or finish
    if not done:
        raise StreamError("the stream ended before `data: [DONE]`")
    if usage is None:
        raise StreamError("no usage chunk (the request asked stream_options.include_usage)")
    gaps = tuple(b - a for a, b in zip(stamps, stamps[1:]))
    answer = {"choices": [{"message": {"content": "".join(text)}, "finish_reason": finish}],
              "usage": usage}
    return answer, StreamTiming(stamps[0] - t0 if stamps else None, gaps)


def latency_figures(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The streamed answers' mean time to first token and mean inter-token latency (over every
    gap of every answer), with how many answers and gaps they are over; {} when none streamed
    (rows of a run made before the probe streamed)."""
    return combine_latency((r["ttft_s"], 1, r.get("itl_s"), int(r.get("itl_n") or 0))
                           for r in rows if r.get("ttft_s") is not None)


def combine_latency(parts: Iterable[tuple[float, int, float | None, int]]) -> dict[str, Any]:
    """(mean TTFT, answers, mean ITL, gaps) of several parts (answers, shards) as one: each
    mean weighted by what it is over."""
    parts = [p for p in parts if p[1]]
    if not parts:
        return {}
    n, gaps = sum(p[1] for p in parts), sum(p[3] for p in parts)
    itl = sum(float(p[2]) * p[3] for p in parts if p[3] and p[2] is not None) / gaps \
        if gaps else None
    return {"ttft_s_mean": round(sum(float(p[0]) * p[1] for p in parts) / n, 5), "ttft_n": n,
            "itl_s_mean": None if itl is None else round(itl, 5), "itl_n": gaps}
