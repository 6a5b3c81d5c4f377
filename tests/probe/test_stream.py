"""Issue 41, item 6: the probe reads its scored answers streamed, as SGLang's users do, and
reports their time to first token and inter-token latency beside the throughput.

The event parsing and the figures are pure; tests/reference/test_streaming.py and the `run`
end-to-end tests hold them against the real server.
"""

from __future__ import annotations

import json

import pytest

from dsv4bisect.probe.conditions import throughput_lines
from dsv4bisect.probe.stream import (
    StreamError,
    combine_latency,
    latency_figures,
    read_chat_stream,
)


def _sse(*chunks: object) -> list[bytes]:
    lines: list[bytes] = []
    for c in chunks:
        lines += [b"data: " + (c.encode() if isinstance(c, str) else json.dumps(c).encode()), b""]
    return lines


def _delta(content: str | None, finish: str | None = None) -> dict:
    delta = {"reasoning_content": None} | ({} if content is None else {"content": content})
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4,
                                  "prompt_tokens_details": {"cached_tokens": 3}}}


def test_a_stream_reads_as_the_unstreamed_answer_with_its_timing() -> None:
    clock = iter([1.25, 1.30, 1.40, 1.45]).__next__  # when each piece of text arrives
    lines = _sse(_delta(""), _delta("48"), _delta("17"), _delta(""), _delta("29"),
                 _delta("3"), _delta(None, "stop"), USAGE, "[DONE]")
    answer, timing = read_chat_stream(lines, t0=1.0, clock=clock)
    assert answer == {"choices": [{"message": {"content": "4817293"}, "finish_reason": "stop"}],
                      "usage": USAGE["usage"]}
    assert timing.ttft_s == pytest.approx(0.25)
    assert timing.gaps_s == pytest.approx((0.05, 0.10, 0.05))
    assert timing.itl_s == pytest.approx(0.2 / 3)


@pytest.mark.parametrize(("lines", "why"), [
    (_sse(_delta("4"), USAGE), "ended before"),  # cut off: no [DONE]
    (_sse(_delta("4"), "[DONE]"), "no usage chunk"),
    (_sse({"object": "error", "message": "boom"}, "[DONE]"), "error event"),
    (_sse("[1, 2]", "[DONE]"), "not a JSON object"),
])
def test_a_broken_stream_is_said_so(lines: list[bytes], why: str) -> None:
    with pytest.raises(StreamError, match=why):
        read_chat_stream(lines, t0=0.0, clock=lambda: 0.0)


def test_latency_figures_weigh_each_gap_and_answer() -> None:
    rows = [{"ttft_s": 0.1, "itl_s": 0.02, "itl_n": 3}, {"ttft_s": 0.3, "itl_s": 0.04,
                                                          "itl_n": 1},
            {"ttft_s": None, "itl_n": 0}, {"latency_s": 1.0}]  # unstreamed / older rows
    assert latency_figures(rows) == {"ttft_s_mean": 0.2, "ttft_n": 2, "itl_s_mean": 0.025,
                                     "itl_n": 4}
    assert latency_figures([{"latency_s": 1.0}]) == {}
    shards = combine_latency([(0.2, 2, 0.025, 4), (0.5, 1, None, 0)])
    assert shards == {"ttft_s_mean": 0.3, "ttft_n": 3, "itl_s_mean": 0.025, "itl_n": 4}


def test_the_throughput_lines_give_ttft_and_itl() -> None:
    level = {"requests": 4, "tokens": 900, "wall_s": 2.0, "requests_per_s": 2.0,
             "tokens_per_s": 450.0, "arms": ["cold"], "ttft_s_mean": 0.412, "ttft_n": 4,
             "itl_s_mean": 0.0381, "itl_n": 30}
    old = {k: v for k, v in level.items() if not k.startswith(("ttft", "itl"))}
    lines = throughput_lines({"baseline": {"1": level}, "candidate": {"1": old},
                              "x": {}})
    slow = throughput_lines({"baseline": {"16": {**level, "ttft_s_mean": 1.64}}})
    assert "TTFT 1.64 s, ITL 38.1 ms" in slow[0]
    assert lines == [
        "baseline at concurrency 1: 2 requests/s, 450 tokens/s, TTFT 412 ms, ITL 38.1 ms "
        "(4 requests, cold, 2.0 s)",
        "candidate at concurrency 1: 2 requests/s, 450 tokens/s (4 requests, cold, 2.0 s)"]
