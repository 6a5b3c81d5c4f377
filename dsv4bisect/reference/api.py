"""The endpoints' logic: SGLang's request and response shapes over one `Generator`.

OpenAI chat/completions (`serving_chat.py`, `serving_completions.py` shapes), SGLang's native
`/generate` (`meta_info` as the tokenizer manager builds it), `/tokenize` (SGLang's, plus vLLM's
`messages` form), `/v1/models` and `/server_info`. HTTP plumbing lives in `reference/http_app.py`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsv4bisect.reference.chat import ChatFormatError, apply_chat_template, normalize_messages
from dsv4bisect.reference.generation import Bootstrap, Generator, GenOutput, GenSpec, finite
from dsv4bisect.reference.request_body import ApiError, Body, check_sampling, is_int_list
from dsv4bisect.reference.tokenizer import ByteTokenizer

# `stream` is served by reference/stream_api.py (the HTTP layer routes `stream: true` there)
CHAT_UNSUPPORTED = ("min_p", "n", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "min_tokens", "logit_bias", "regex", "ebnf",
                    "stop_regex", "custom_logit_processor", "tools", "response_format", "lora_path")
COMPLETION_UNSUPPORTED = (*CHAT_UNSUPPORTED, "best_of", "json_schema", "suffix")
SAMPLING_PARAMS = ("max_new_tokens", "temperature", "stop", "stop_token_ids", "ignore_eos",
                   "no_stop_trim", "skip_special_tokens", "spaces_between_special_tokens",
                   "sampling_seed", "top_p", "top_k", "min_p", "n", "min_new_tokens",
                   "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
                   "regex", "ebnf", "json_schema", "structural_tag", "stop_regex",
                   "custom_params")
WEIGHT_VERSION = "default"


@dataclass(frozen=True)
class ApiConfig:
    served_model_name: str
    max_model_len: int
    server_info: dict[str, Any]  # engine.info() plus the server's own settings


def new_id(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat body: its prompt ids, the generation, top log-probs (None: none asked)."""

    body: Body
    prompt: tuple[int, ...]
    spec: GenSpec
    top: int | None
    model: str


@dataclass(frozen=True)
class CompletionRequest:
    """A checked completions body: each prompt's text (for `echo`) and generation."""

    body: Body
    prompts: list[tuple[str, GenSpec]]
    echo: bool
    logprobs: int | None  # top log-probs per token; None: none asked
    model: str


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """OpenAI usage; `prompt_tokens_details.cached_tokens` as SGLang reports it with
    --enable-cache-report (always on here: the prefix cache is part of what is tested)."""
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion, "prompt_tokens_details": {"cached_tokens": cached},
            "reasoning_tokens": 0}


def bootstrap_of(body: Body, index: int = 0) -> Bootstrap | None:
    """SGLang's `bootstrap_host`, `bootstrap_port`, `bootstrap_room`, which its router adds to
    a request for PD servers (one list entry per prompt of a batch); None when absent."""
    fields = [body.data.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")]
    if all(f is None for f in fields):
        return None
    if all(isinstance(f, list) for f in fields):
        if not all(index < len(f) for f in fields):
            raise ApiError("the bootstrap_* lists must have one entry per prompt")
        fields = [f[index] for f in fields]
    host, port, room = fields
    if not (isinstance(host, str) and host and isinstance(port, int) and not isinstance(
            port, bool) and 0 <= port <= 65535 and isinstance(room, int)
            and not isinstance(room, bool) and room >= 0):
        raise ApiError("bootstrap_host must be a host name, bootstrap_port a port and "
                       "bootstrap_room a non-negative integer (all three, or none)")
    return Bootstrap(host, port, room)


def _check_thinking(body: Body) -> None:
    kwargs = body.get("chat_template_kwargs", {})
    if not isinstance(kwargs, dict):
        raise ApiError("`chat_template_kwargs` must be an object")
    effort = body.get("reasoning_effort")
    if any(kwargs.get(k) is True for k in ("thinking", "enable_thinking")) or effort not in (
        None, "none"
    ):
        raise ApiError("the embedded engine has no thinking mode; send "
                       '`chat_template_kwargs: {"thinking": false}` or leave it unset')


class Api:
    """Endpoint handlers; each takes a parsed JSON body and returns a JSON-able value."""

    def __init__(self, generator: Generator, config: ApiConfig) -> None:
        self.gen = generator
        self.tok: ByteTokenizer = generator.tokenizer
        self.cfg = config

    # ---- shared checks ---------------------------------------------------------------------

    def _prompt_ids(self, ids: Sequence[int], what: str = "input_ids") -> tuple[int, ...]:
        if not ids:
            raise ApiError(f"`{what}` is empty")
        try:
            self.tok.check_ids(ids)
        except ValueError as exc:
            raise ApiError(f"`{what}`: {exc}") from None
        return tuple(ids)

    def _encode(self, text: str, *, add_bos: bool) -> tuple[int, ...]:
        try:
            return tuple(self.tok.encode(text, add_bos=add_bos))
        except UnicodeEncodeError:
            raise ApiError("the text is not valid Unicode (it has a lone surrogate)") from None

    def _max_new(self, prompt: int, requested: int | None) -> int:
        limit = self.cfg.max_model_len
        if prompt >= limit:
            raise ApiError(f"The input ({prompt} tokens) is longer than the model's context "
                           f"length ({limit} tokens).")
        if requested is None:
            return limit - prompt
        if prompt + requested > limit:
            raise ApiError(
                f"Requested token count exceeds the model's maximum context length of {limit} "
                f"tokens. You requested a total of {prompt + requested} tokens: {prompt} tokens "
                f"from the input messages and {requested} tokens for the completion. Please "
                "reduce the number of tokens in the input messages or the completion to fit "
                "within the limit."
            )
        return requested

    def _chat_prompt(self, body: Body, *, generation_prompt: bool = True) -> tuple[int, ...]:
        _check_thinking(body)
        try:
            messages = normalize_messages(body.data.get("messages"))
            return tuple(apply_chat_template(
                messages, generation_prompt,
                continue_final=body.get_bool("continue_final_message", False),
            ))
        except ChatFormatError as exc:
            raise ApiError(str(exc)) from None

    def _stops(self, body: Body) -> dict[str, Any]:
        return {
            "stop": body.get_strs("stop"),
            "stop_token_ids": body.get_ints("stop_token_ids") or (),
            "ignore_eos": body.get_bool("ignore_eos", False),
            "no_stop_trim": body.get_bool("no_stop_trim", False),
            "skip_special_tokens": body.get_bool("skip_special_tokens", True),
        }

    # ---- OpenAI chat and completions -------------------------------------------------------

    def chat(self, data: object) -> dict[str, Any]:
        req = self.chat_request(data)
        return self.chat_response(req, self.gen.run(req.spec))

    def chat_request(self, data: object) -> ChatRequest:
        """A chat body checked and turned into the generation it asks for (the streamed and
        the unstreamed answer share it)."""
        body = Body(data)
        body.get_bool("stream", False)  # a boolean (reference/stream_api.py streams `true`)
        check_sampling(body, CHAT_UNSUPPORTED)
        prompt = self._chat_prompt(body)
        if "input_ids" in body:  # SGLang: pre-tokenized prompt bypasses the template
            prompt = self._prompt_ids(body.get_ints("input_ids") or ())
        requested = body.get_int("max_completion_tokens", None, minimum=1)
        if requested is None:
            requested = body.get_int("max_tokens", None, minimum=1)
        logprobs = body.get_bool("logprobs", False)
        top = body.get_int("top_logprobs", 0, minimum=0) if logprobs else 0
        spec = GenSpec(prompt, self._max_new(len(prompt), requested), **self._stops(body),
                       **body.sampling("seed"), return_logprob=logprobs, top_logprobs_num=top,
                       bootstrap=bootstrap_of(body))
        return ChatRequest(body, prompt, spec, top if logprobs else None,
                           body.get_str("model", self.cfg.served_model_name) or "")

    def chat_response(self, req: ChatRequest, out: GenOutput) -> dict[str, Any]:
        body = req.body
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": out.text or None,
                        "reasoning_content": None, "tool_calls": None},
            "logprobs": self.chat_logprobs(out, req.top) if req.top is not None else None,
            "finish_reason": out.finish_reason["type"],
            "matched_stop": out.finish_reason.get("matched"),
        }
        if body.get_bool("return_prompt_token_ids", False):
            choice["prompt_token_ids"] = list(req.prompt)
        if body.get_bool("return_token_ids", False):
            choice["token_ids"] = out.output_ids
        return {
            "id": new_id("chatcmpl-"), "object": "chat.completion", "created": int(time.time()),
            "model": req.model, "choices": [choice],
            "usage": usage(len(req.prompt), len(out.output_ids), out.cached_tokens),
            "metadata": {"weight_version": WEIGHT_VERSION},
        }

    def _top_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": self.tok.token_text(token_id),
                "bytes": list(self.tok.token_bytes(token_id)), "logprob": finite(logprob)}

    def chat_logprobs(self, out: GenOutput, top: int, first: int = 0) -> dict[str, Any]:
        """OpenAI chat log-probs of the output tokens from `first` on."""
        content = []
        for token_id, lp, alts in zip(out.output_ids[first:], out.output_logprobs[first:],
                                      out.output_top[first:]):
            entry = self._top_entry(token_id, 0.0) | {"logprob": lp}
            entry["top_logprobs"] = [self._top_entry(t, x) for t, x in alts[:top]]
            content.append(entry)
        return {"content": content}

    def _completion_prompts(self, body: Body) -> list[tuple[tuple[int, ...], str]]:
        prompt = body.data.get("prompt")
        if isinstance(prompt, str):
            prompt = [prompt]
        elif is_int_list(prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise ApiError("Prompt cannot be empty")
        out = []
        for p in prompt:
            if isinstance(p, str) and p:
                out.append((self._encode(p, add_bos=True), p))
            elif is_int_list(p):
                ids = self._prompt_ids(p, "prompt")
                out.append((ids, self.tok.decode(ids, skip_special_tokens=True)))
            else:
                raise ApiError("`prompt` must be a non-empty string, a list of token ids, or a "
                               "list of either")
        return out

    def completions(self, data: object) -> dict[str, Any]:
        req = self.completion_request(data)
        choices, n_prompt, n_out, n_cached = [], 0, 0, 0
        for index, (text, spec) in enumerate(req.prompts):
            out = self.gen.run(spec)
            choices.append(self.completion_choice(req, index, text, out))
            n_prompt, n_out = n_prompt + len(spec.input_ids), n_out + len(out.output_ids)
            n_cached += out.cached_tokens
        return {
            "id": new_id("cmpl-"), "object": "text_completion", "created": int(time.time()),
            "model": req.model, "choices": choices,
            "usage": usage(n_prompt, n_out, n_cached), "metadata": {"weight_version": WEIGHT_VERSION},
        }

    def completion_request(self, data: object) -> CompletionRequest:
        """A completions body checked: each prompt's text and generation."""
        body = Body(data)
        body.get_bool("stream", False)  # a boolean (reference/stream_api.py streams `true`)
        check_sampling(body, COMPLETION_UNSUPPORTED)
        echo = body.get_bool("echo", False)
        logprobs = body.get_int("logprobs", None, minimum=0)
        requested = body.get_int("max_tokens", 16, minimum=1)
        prompts = [(text, GenSpec(
            ids, self._max_new(len(ids), requested), **self._stops(body),
            **body.sampling("seed"), return_logprob=logprobs is not None,
            top_logprobs_num=logprobs or 0,
            logprob_start_len=0 if echo and logprobs is not None else -1,
            bootstrap=bootstrap_of(body, index),
        )) for index, (ids, text) in enumerate(self._completion_prompts(body))]
        return CompletionRequest(body, prompts, echo, logprobs,
                                 body.get_str("model", self.cfg.served_model_name) or "")

    def completion_choice(self, req: CompletionRequest, index: int, text: str,
                          out: GenOutput) -> dict[str, Any]:
        return {
            "index": index, "text": (text if req.echo else "") + out.text,
            "logprobs": None if req.logprobs is None else self._legacy_logprobs(
                out, req.echo, req.logprobs),
            "finish_reason": out.finish_reason.get("type"),  # None: a streamed snapshot
            "matched_stop": out.finish_reason.get("matched"),
        }

    def _legacy_logprobs(self, out: GenOutput, echo: bool, top: int) -> dict[str, Any]:
        """OpenAI completions logprobs (SGLang: text_offset is -1, top is a text-keyed dict)."""
        ids, lps, alts = list(out.output_ids), list(out.output_logprobs), list(out.output_top)
        if echo:
            ids, lps = out.input_ids + ids, out.input_logprobs + lps
            alts = [a or [] for a in out.input_top] + alts
        tops = []
        for i, alt in enumerate(alts[: len(ids)] if top else []):
            entry: dict[str, float | None] = {}
            for t, x in alt[:top]:
                entry.setdefault(self.tok.token_text(t), finite(x))
            tops.append(None if echo and i == 0 else entry)
        return {"text_offset": [-1] * len(ids), "token_logprobs": lps,
                "tokens": [self.tok.token_text(t) for t in ids], "top_logprobs": tops}
