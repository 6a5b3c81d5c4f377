"""Issue 41, item 6: `serve` streams (`"stream": true`) as SGLang does, and a client that hangs
up mid-stream cancels its request.

One `dsv4bisect serve --checkpoint embedded --precision exact` process (the trained checkpoint
answers the fact it is given, so the answers are real text): the official OpenAI client's
streamed chat equals its unstreamed one token for token, completions and /generate stream what
they answer unstreamed, stop strings cut the streamed text where they cut the unstreamed one,
and closing the connection mid-stream stops the generation at its next step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from test_server import _serving

openai = pytest.importorskip("openai")  # the `test` extra installs it

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

FACT = [{"role": "user", "content": "Remember: the code for amber falcon is 4817293. "
                                    "A gray cat slept on the warm step. What is the code for "
                                    "amber falcon?"}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    # the trained checkpoint (the later `--checkpoint` wins over start_server's random one)
    yield from _serving(None, "--precision", "exact", "--checkpoint", "embedded")


def events(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    """The `data:` payloads of a streamed answer, `[DONE]` as the string."""
    r = requests.post(f"{url}{path}", json=body, stream=True, timeout=300)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    out = []
    for line in r.iter_lines():
        if line.startswith(b"data: "):
            data = line[len(b"data: "):].decode()
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_openai_client_streamed_chat_equals_the_unstreamed_one_token_for_token(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    ask = {"model": "embedded", "messages": FACT, "max_tokens": 24, "logprobs": True,
           "top_logprobs": 2}
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(**ask, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content == "4817293"  # the checkpoint retrieves the fact
    assert text == whole.choices[0].message.content
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.content]
    assert [(t.token, t.bytes) for t in tokens] == [
        (t.token, t.bytes) for t in whole.choices[0].logprobs.content]  # eos included
    assert [t.logprob for t in tokens] == [t.logprob for t in whole.choices[0].logprobs.content]
    assert chunks[0].choices[0].delta.role == "assistant"
    last = [c for c in chunks if c.choices][-1].choices[0]
    assert last.finish_reason == whole.choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # include_usage
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(client.chat.completions.create(model="embedded", messages=FACT, max_tokens=24,
                                                stream=True))
    assert all(c.choices for c in plain)  # no usage chunk unless asked


def test_chat_stream_shape_is_sglangs(url: str) -> None:
    got = events(url, "/v1/chat/completions", {"messages": FACT, "max_tokens": 24,
                                               "stream": True})
    assert got[-1] == "[DONE]"
    first, *middle, finish, _ = got
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant",
                                            "content": ""}
    assert all(set(c["choices"][0]["delta"]) == {"reasoning_content", "content"}
               for c in middle)
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert finish["choices"][0]["matched_stop"] == 1  # eos
    assert len({c["id"] for c in got[:-1]}) == 1 and "usage" not in finish


def test_stop_strings_cut_the_stream_where_they_cut_the_answer(url: str) -> None:
    body = {"messages": FACT, "max_tokens": 24, "stop": ["29"]}
    whole = requests.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
    got = events(url, "/v1/chat/completions", {**body, "stream": True})
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in got[:-1]
                   if c["choices"])
    assert text == whole["choices"][0]["message"]["content"] == "4817"
    assert got[-2]["choices"][0]["matched_stop"] == "29"


def test_completions_and_generate_stream_what_they_answer(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    ask = {"model": "embedded", "prompt": ["The sky is", "Remember: 4817293. Again:"],
           "max_tokens": 12, "logprobs": 1, "echo": True}
    whole = client.completions.create(**ask)
    chunks = list(client.completions.create(**ask, stream=True))
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        assert [t for c in mine if c.logprobs for t in c.logprobs.tokens] == \
            choice.logprobs.tokens
        assert mine[-1].finish_reason == choice.finish_reason
    body = {"text": "Remember: 4817293. Again:", "sampling_params": {"max_new_tokens": 10},
            "return_logprob": True}
    plain = requests.post(f"{url}/generate", json=body, timeout=300).json()
    got = events(url, "/generate", {**body, "stream": True})
    assert got[-1] == "[DONE]"
    texts = [g["text"] for g in got[:-1]]
    assert texts == sorted(texts, key=len) and all(plain["text"].startswith(t) for t in texts)
    last = got[-2]  # cumulative, as SGLang: the last event is the whole answer
    assert (last["text"], last["output_ids"]) == (plain["text"], plain["output_ids"])
    assert last["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]
    assert all(g["meta_info"]["finish_reason"] is None for g in got[:-2])
    assert len({g["meta_info"]["id"] for g in got[:-1]}) == 1
    assert last["meta_info"]["output_token_logprobs"] == plain["meta_info"]["output_token_logprobs"]


def test_a_bad_streamed_request_is_refused_before_any_event(url: str) -> None:
    for body in ({"messages": FACT, "stream": True, "n": 2},
                 {"messages": FACT, "stream": True, "stream_options": {"include_usage": 1}},
                 {"messages": FACT, "stream": "yes"}):
        r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["type"] == "BadRequestError", body


def test_a_client_that_hangs_up_cancels_its_streamed_request(url: str) -> None:
    before = requests.get(f"{url}/server_info", timeout=10).json()
    body = {"messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=300) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith(b"data: {")
            if seen == 6:
                break  # leaving the block closes the connection: the client hung up
    deadline = time.monotonic() + 20
    while True:
        info = requests.get(f"{url}/server_info", timeout=10).json()
        if info["running_requests"] == 0 and info["waiting_requests"] == 0:
            break
        assert time.monotonic() < deadline, "the abandoned request is still running"
        time.sleep(0.1)
    # cancelled, not finished: it left its batch long before its 2000 decode steps
    assert info["finished_requests"] == before["finished_requests"]
    assert info["decode_batches"] - before["decode_batches"] < 200
    t0 = time.monotonic()  # and the engine is free for the next request at once
    requests.post(f"{url}/v1/chat/completions", json={"messages": FACT, "max_tokens": 8},
                  timeout=60).raise_for_status()
    assert time.monotonic() - t0 < 30
