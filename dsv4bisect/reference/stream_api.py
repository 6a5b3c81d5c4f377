"""Streamed answers (`"stream": true`) as SGLang sends them: server-sent events on
`/v1/chat/completions`, `/v1/completions` and `/generate`.

Shapes read from SGLang 0.5.23 (`entrypoints/openai/serving_chat.py` with `sse_utils.py`,
`serving_completions.py`, `entrypoints/http_server.py` with the tokenizer manager's stream
output); each event is `data: <JSON>\\n\\n` and the stream ends with `data: [DONE]\\n\\n`:

- chat: a first chunk with `delta: {role: "assistant", content: ""}`, then one chunk per
  piece of text (`delta: {content}`, with `logprobs: {content: [...]}` for its tokens when
  asked), then a chunk with `finish_reason` and `matched_stop` and an empty delta; with
  `stream_options: {include_usage: true}`, a last chunk with `choices: []` and the usage.
  Every delta carries `reasoning_content: null` (SGLang keeps the key for the OpenAI client).
- completions: one chunk per piece of text (`choices[0].text`), the last with its
  `finish_reason`; the usage chunk as chat's (`choices: []`, null fields left out).
- /generate: each event is the whole answer so far (SGLang's default, not incremental):
  `text`, `output_ids` and `meta_info` (`finish_reason` null until the last).

A batch (several completions prompts, a /generate list) streams its prompts one after the
other, each event naming its `index`. What a piece of text is: `Generator.stream`'s
snapshots (reference/generation.py), so the pieces joined are the unstreamed answer's text.
Each builder checks the request first (an ApiError or an engine refusal raises before any
event) and returns the events as an iterator the HTTP layer (reference/event_stream.py)
sends as they come.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from dsv4bisect.reference.api import ChatRequest, CompletionRequest, new_id, usage
from dsv4bisect.reference.generation import GenOutput
from dsv4bisect.reference.native_api import GenerateRequest, ServerApi
from dsv4bisect.reference.request_body import ApiError, Body

DONE = "data: [DONE]\n\n"
ROUTES = ("chat", "completions", "generate")  # the handlers that stream


def event(payload: Any) -> str:
    return "data: " + json.dumps(payload, ensure_ascii=False, allow_nan=False,
                                 separators=(",", ":")) + "\n\n"


def wants_stream(data: object) -> bool:
    """Whether a request body asks for a streamed answer (`stream` must be a boolean)."""
    if not isinstance(data, dict):
        return False
    return Body(data).get_bool("stream", False)


def include_usage(body: Body) -> bool:
    options = Body(body.get("stream_options", {}), "`stream_options`")
    return options.get_bool("include_usage", False)


def open_stream(api: ServerApi, handler: str, data: object) -> Iterator[str]:
    """The events of a streamed request to `handler` (chat, completions, generate)."""
    if handler == "chat":
        return _chat(api, api.chat_request(data))
    if handler == "completions":
        return _completions(api, data)
    if handler == "generate":
        return _generate(api, data)
    raise ApiError(f"`stream` is not supported on this route ({handler})")


# -- chat ---------------------------------------------------------------------------------------
def _chat(api: ServerApi, req: ChatRequest) -> Iterator[str]:
    with_usage = include_usage(req.body)  # a bad stream_options is a 400, before any event
    outputs = api.gen.stream(req.spec)
    return _chat_events(api, req, outputs, with_usage)


def _chat_events(api: ServerApi, req: ChatRequest, outputs: Iterator[GenOutput],
                 with_usage: bool) -> Iterator[str]:
    head = {"id": new_id("chatcmpl-"), "object": "chat.completion.chunk",
            "created": int(time.time()), "model": req.model}

    def chunk(delta: dict[str, Any], logprobs: Any = None, finish: str | None = None,
              matched: Any = None) -> str:
        return event({**head, "choices": [{
            "index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": logprobs,
            "finish_reason": finish, "matched_stop": matched}]})

    yield chunk({"role": "assistant", "content": ""})
    text_sent, tokens_sent = 0, 0
    out: GenOutput | None = None
    pending = None  # log-probs of tokens whose text came with no new piece: on the next chunk
    for out in outputs:
        piece = out.text[text_sent:]
        if not piece and not out.final:
            continue
        n = len(out.output_ids)
        if req.top is not None and n > tokens_sent:
            pending = api.chat_logprobs(out, req.top, tokens_sent)
            tokens_sent = n
        if piece:
            yield chunk({"content": piece}, pending)
            pending = None
        text_sent = len(out.text)
    assert out is not None and out.final  # Generator.stream ends with the final output
    yield chunk({}, pending, out.finish_reason["type"], out.finish_reason.get("matched"))
    if with_usage:
        yield event({**head, "choices": [],
                     "usage": usage(len(req.prompt), len(out.output_ids), out.cached_tokens)})
    yield DONE


# -- completions --------------------------------------------------------------------------------
def _completions(api: ServerApi, data: object) -> Iterator[str]:
    req = api.completion_request(data)
    with_usage = include_usage(req.body)
    first = api.gen.stream(req.prompts[0][1])  # the first prompt checked before any event
    return _completion_events(api, req, first, with_usage)


def _completion_events(api: ServerApi, req: CompletionRequest, first: Iterator[GenOutput],
                       with_usage: bool) -> Iterator[str]:
    head = {"id": new_id("cmpl-"), "object": "text_completion", "created": int(time.time()),
            "model": req.model}
    n_prompt = n_out = n_cached = 0
    for index, (text, spec) in enumerate(req.prompts):
        sent_text = sent_lp = 0  # characters and log-prob entries sent (echo: the prompt's too)
        for out in first if index == 0 else api.gen.stream(spec):
            whole = api.completion_choice(req, index, text, out)
            piece = whole["text"][sent_text:]
            if not piece and not out.final:
                continue
            lps = whole["logprobs"]
            if lps is not None:  # this chunk's tokens (SGLang: null when none is new)
                lps = {key: values[sent_lp:] for key, values in lps.items()}
                sent_lp += len(lps["tokens"])
                lps = lps if lps["tokens"] else None
            sent_text += len(piece)
            finish = out.finish_reason.get("type") if out.final else None
            yield event({**head, "choices": [{
                "index": index, "text": piece, "logprobs": lps, "finish_reason": finish,
                "matched_stop": whole["matched_stop"] if out.final else None}], "usage": None})
        n_prompt += len(spec.input_ids)
        n_out += len(out.output_ids)
        n_cached += out.cached_tokens
    if with_usage:
        yield event({**head, "choices": [], "usage": usage(n_prompt, n_out, n_cached)})
    yield DONE


# -- /generate ----------------------------------------------------------------------------------
def _generate(api: ServerApi, data: object) -> Iterator[str]:
    req = api.generate_request(data)
    first = api.gen.stream(req.specs[0])
    return _generate_events(api, req, first)


def _generate_events(api: ServerApi, req: GenerateRequest, first: Iterator[GenOutput]
                     ) -> Iterator[str]:
    for index, spec in enumerate(req.specs):
        tic = time.perf_counter()
        for out in (first if index == 0 else api.gen.stream(spec)):
            result = api.generate_result(req, index, out, tic)
            yield event({**result, "index": index} if req.batched else result)
    yield DONE
