"""The embedded engine behind vLLM's HTTP API subset (`dsv4bisect serve --api vllm`).

What a vLLM 0.20–0.34 server answers, in its shapes (`entrypoints/openai/*/protocol.py`, read
from the wheels; the fields the probe sends are checked against the shipped request models,
docs/vllm.md): `/v1/completions` with `prompt_logprobs` (per prompt position a dict keyed by the
token id: `{"logprob", "rank", "decoded_token"}`, the position's own token and the top k; the
first position `null`), `logprobs` (OpenAI's legacy shape, `return_tokens_as_token_ids`),
`return_token_ids` (`token_ids`, `prompt_token_ids`); `/v1/chat/completions`; `/tokenize` and
`/detokenize`; `/v1/models` (`owned_by: vllm`, `max_model_len`); `/health`; and the dev-mode
routes `/reset_prefix_cache` and `/server_info` (`vllm_config` as JSON; the embedded engine adds
its `patches` and settings at the top level, which `run` verifies). Errors are vLLM's
`ErrorResponse`: `{"error": {"message", "type", "param", "code"}}`.

vLLM semantics kept: usage carries `prompt_tokens_details.cached_tokens` (the vllm kind starts
vLLM with --enable-prompt-tokens-details); a request asking for prompt logprobs does not read
the prefix cache (vLLM's `skip_reading_prefix_cache`); `max_tokens` is clamped to the context
left, a prompt that fills it is refused with vLLM's message; `finish_reason` is `stop` /
`length` with `stop_reason` the stop token id or string (null at EOS). Differences: `rank` is
exact inside the top k and null for a prompt token outside it (the engine does not rank the
whole vocabulary); no streaming, no `n > 1`, no penalties (400, as the SGLang API refuses them).
"""

from __future__ import annotations

import time
from typing import Any

from dsv4bisect.reference.api import CHAT_UNSUPPORTED, COMPLETION_UNSUPPORTED, new_id
from dsv4bisect.reference.generation import GenOutput, GenSpec, TopList, finite
from dsv4bisect.reference.native_api import ServerApi
from dsv4bisect.reference.request_body import ApiError, Body, check_sampling
from dsv4bisect.reference.tokenizer import BOS_ID, EOS_ID

# path -> (methods, handler on VllmApi, JSON body): http_app builds its routes from this in
# vLLM mode (the handler names are the SGLang routes' where the work is the same)
VLLM_ROUTES: dict[str, tuple[tuple[str, ...], str, bool]] = {
    "/health": (("GET",), "health", False),
    "/v1/models": (("GET",), "models", False),
    "/server_info": (("GET",), "server_info", False),
    "/reset_prefix_cache": (("POST",), "flush_cache", False),
    "/v1/completions": (("POST",), "completions", True),
    "/v1/chat/completions": (("POST",), "chat", True),
    "/tokenize": (("POST",), "tokenize", True),
    "/detokenize": (("POST",), "detokenize", True),
    "/version": (("GET",), "version", False),
}


def vllm_error(status: int, message: str, err_type: str, param: str | None = None
               ) -> dict[str, Any]:
    """vLLM's ErrorResponse body."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


class VllmApi(ServerApi):
    """vLLM's endpoints over the same Generator (see the module docstring)."""

    # ---- limits and prompts ------------------------------------------------------------------
    def _max_new(self, prompt: int, requested: int | None) -> int:
        limit = self.cfg.max_model_len
        if prompt >= limit:
            raise ApiError(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {prompt} input tokens, which exceeds this limit even without any "
                "output tokens. Please reduce the length of the input prompt.")
        left = limit - prompt
        return left if requested is None else min(requested, left)

    def _prompt(self, body: Body) -> tuple[tuple[int, ...], str]:
        prompts = self._completion_prompts(body)
        if len(prompts) != 1:
            raise ApiError("the embedded engine serves one prompt per request (n = 1)")
        return prompts[0]

    # ---- /v1/completions ---------------------------------------------------------------------
    def completions(self, data: object) -> dict[str, Any]:
        body = Body(data)
        check_sampling(body, COMPLETION_UNSUPPORTED)
        ids, text = self._prompt(body)
        echo = body.get_bool("echo", False)
        logprobs = body.get_int("logprobs", None, minimum=0)
        if echo and logprobs is not None:
            raise ApiError("`echo` with `logprobs` is not supported by the embedded engine; "
                           "ask for `prompt_logprobs` instead")
        prompt_lp = body.get_int("prompt_logprobs", None, minimum=-1)
        if prompt_lp == -1:
            prompt_lp = self.tok.vocab_size
        requested = body.get_int("max_tokens", 16, minimum=1)
        top = max(logprobs or 0, prompt_lp or 0)
        out = self.gen.run(GenSpec(
            ids, self._max_new(len(ids), requested), **self._stops(body),
            **body.sampling("seed"), return_logprob=logprobs is not None or prompt_lp is not None,
            top_logprobs_num=top, logprob_start_len=0 if prompt_lp is not None else -1))
        as_ids = body.get_bool("return_tokens_as_token_ids", False)
        choice: dict[str, Any] = {
            "index": 0, "text": (text if echo else "") + out.text,
            "logprobs": None if logprobs is None else self._completion_logprobs(
                out, logprobs, as_ids),
            "finish_reason": out.finish_reason["type"],
            "stop_reason": self._stop_reason(out),
            "prompt_logprobs": None if prompt_lp is None else self._prompt_logprobs(
                out, prompt_lp),
        }
        if body.get_bool("return_token_ids", False):
            choice |= {"token_ids": out.output_ids, "prompt_token_ids": list(ids)}
        return {"id": new_id("cmpl-"), "object": "text_completion", "created": int(time.time()),
                "model": body.get_str("model", self.cfg.served_model_name), "choices": [choice],
                "usage": _usage(len(ids), len(out.output_ids), out.cached_tokens)}

    def _stop_reason(self, out: GenOutput) -> int | str | None:
        matched = out.finish_reason.get("matched")
        return None if matched == EOS_ID else matched

    def _token(self, token_id: int, as_ids: bool) -> str:
        return f"token_id:{token_id}" if as_ids else self.tok.token_text(token_id)

    def _completion_logprobs(self, out: GenOutput, k: int, as_ids: bool) -> dict[str, Any]:
        """OpenAI's legacy logprobs for the generated tokens (vLLM: `text_offset` counted in
        characters of the generated text, top entries keyed by the token's text)."""
        tokens = [self._token(t, as_ids) for t in out.output_ids]
        offsets, pos = [], 0
        for t in out.output_ids:
            offsets.append(pos)
            pos += len(self.tok.token_text(t))
        tops: list[dict[str, float | None] | None] = []
        for token_id, lp, alts in zip(out.output_ids, out.output_logprobs, out.output_top):
            entry = {self._token(token_id, as_ids): lp}
            for t, x in alts[:k]:
                entry.setdefault(self._token(t, as_ids), finite(x))
            tops.append(entry if k else None)
        return {"text_offset": offsets, "token_logprobs": list(out.output_logprobs),
                "tokens": tokens, "top_logprobs": tops}

    def _prompt_logprobs(self, out: GenOutput, k: int) -> list[dict[str, Any] | None]:
        """Per prompt position: null at 0, else {id: {logprob, rank, decoded_token}} with the
        position's own token first, then the top k by rank."""
        rows: list[dict[str, Any] | None] = []
        for i, (token_id, lp, alts) in enumerate(zip(out.input_ids, out.input_logprobs,
                                                     out.input_top)):
            if i == 0 or alts is None:
                rows.append(None)
                continue
            ranked: TopList = list(alts)
            rank = next((r + 1 for r, (t, _) in enumerate(ranked) if t == token_id), None)
            row = {str(token_id): {"logprob": lp, "rank": rank,
                                   "decoded_token": self.tok.token_text(token_id)}}
            for r, (t, x) in enumerate(ranked[:k]):
                row.setdefault(str(t), {"logprob": finite(x), "rank": r + 1,
                                        "decoded_token": self.tok.token_text(t)})
            rows.append(row)
        return rows

    # ---- /v1/chat/completions ----------------------------------------------------------------
    def chat(self, data: object) -> dict[str, Any]:
        body = Body(data)
        check_sampling(body, CHAT_UNSUPPORTED)
        prompt = self._chat_prompt(body)
        requested = body.get_int("max_completion_tokens", None, minimum=1)
        if requested is None:
            requested = body.get_int("max_tokens", None, minimum=1)
        logprobs = body.get_bool("logprobs", False)
        top = body.get_int("top_logprobs", 0, minimum=0) if logprobs else 0
        out = self.gen.run(GenSpec(
            prompt, self._max_new(len(prompt), requested), **self._stops(body),
            **body.sampling("seed"), return_logprob=logprobs, top_logprobs_num=top))
        choice = {"index": 0,
                  "message": {"role": "assistant", "content": out.text or None,
                              "reasoning_content": None, "tool_calls": []},
                  "logprobs": self._chat_logprobs(out, top) if logprobs else None,
                  "finish_reason": out.finish_reason["type"],
                  "stop_reason": self._stop_reason(out)}
        return {"id": new_id("chatcmpl-"), "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get_str("model", self.cfg.served_model_name), "choices": [choice],
                "usage": _usage(len(prompt), len(out.output_ids), out.cached_tokens),
                "prompt_logprobs": None}

    # ---- tokenizer, models, info ---------------------------------------------------------------
    def tokenize(self, data: object) -> dict[str, Any]:
        """vLLM's /tokenize: TokenizeCompletionRequest (`prompt`) or TokenizeChatRequest
        (`messages`) -> {count, max_model_len, tokens, token_strs}."""
        body = Body(data)
        if "messages" in body:
            tokens = list(self._chat_prompt(
                body, generation_prompt=body.get_bool("add_generation_prompt", True)))
        elif isinstance(body.data.get("prompt"), str):
            tokens = list(self._encode(body.data["prompt"],
                                       add_bos=body.get_bool("add_special_tokens", True)))
        else:
            raise ApiError("`prompt` (a string) or `messages` is required")
        strs = [self.tok.token_text(t) for t in tokens] \
            if body.get_bool("return_token_strs", False) else None
        return {"count": len(tokens), "max_model_len": self.cfg.max_model_len,
                "tokens": tokens, "token_strs": strs}

    def detokenize(self, data: object) -> dict[str, Any]:
        body = Body(data)
        ids = body.get_ints("tokens")
        if ids is None:
            raise ApiError("`tokens` (a list of token ids) is required")
        return {"prompt": self._detokenize(list(ids), True)}

    def models(self) -> dict[str, Any]:
        name = self.cfg.served_model_name
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": self.cfg.server_info.get("model_path") or name, "parent": None,
            "max_model_len": self.cfg.max_model_len, "permission": []}]}

    def server_info(self) -> dict[str, Any]:
        """vLLM's dev-mode /server_info (`config_format=json`) and, at the top level, what the
        embedded engine reports in SGLang mode (its patches and settings, for `run`'s check)."""
        info = dict(self.cfg.server_info) | self.gen.stats()
        config = info.get("config") or {}
        vllm_config = {
            "model_config": {"model": info.get("model_path"), "max_model_len":
                             self.cfg.max_model_len, "served_model_name": [
                                 self.cfg.served_model_name],
                             "hf_config": {k: config.get(k) for k in (
                                 "compress_ratios", "sliding_window", "vocab_size",
                                 "num_hidden_layers") if k in config}},
            "scheduler_config": {"max_num_batched_tokens": info.get("chunked_prefill_size"),
                                 "max_num_seqs": info.get("max_running_requests")},
            "cache_config": {"enable_prefix_caching": not info.get("disable_radix_cache")},
            "speculative_config": _speculative(info),
        }
        return info | {"vllm_config": vllm_config, "vllm_env": {}}

    def flush_cache(self) -> None:  # type: ignore[override]
        """vLLM's /reset_prefix_cache (200, empty body); a pending hot switch first."""
        super().flush_cache()

    def version(self) -> dict[str, Any]:
        return {"version": self.cfg.server_info.get("version")}

    def health_generate(self) -> None:
        self.gen.run(GenSpec((BOS_ID,), max_new_tokens=1))


def _speculative(info: dict[str, Any]) -> dict[str, Any] | None:
    if not info.get("speculative_algorithm"):
        return None
    return {"method": "mtp", "num_speculative_tokens": info.get("speculative_num_steps")}


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """vLLM's UsageInfo with --enable-prompt-tokens-details."""
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion, "prompt_tokens_details": {"cached_tokens": cached}}


