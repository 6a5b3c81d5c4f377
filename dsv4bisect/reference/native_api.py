"""SGLang's native endpoints on top of the OpenAI ones: `/generate`, `/tokenize`, info, health.

`/generate` reports log-probs as SGLang's tokenizer manager does: entries `[logprob, token_id,
text|null]` (text only with `return_text_in_logprobs`), input entries starting at
`logprob_start_len` with the first one null, top-k lists as lists of such entries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dsv4bisect.reference.api import SAMPLING_PARAMS, WEIGHT_VERSION, Api, bootstrap_of, new_id
from dsv4bisect.reference.generation import (
    FAKE_BOOTSTRAP,
    GenOutput,
    GenSpec,
    TopList,
    finite,
)
from dsv4bisect.reference.request_body import ApiError, Body, check_sampling, is_int_list
from dsv4bisect.reference.tokenizer import BOS_ID, EOS_ID, PAD_ID

GENERATE_UNSUPPORTED = ("min_p", "n", "min_new_tokens", "presence_penalty",
                        "frequency_penalty", "repetition_penalty", "logit_bias", "regex", "ebnf",
                        "json_schema", "structural_tag", "stop_regex")


@dataclass(frozen=True)
class GenerateRequest:
    """A checked /generate body: one generation per prompt."""

    body: Body
    specs: list[GenSpec]
    batched: bool
    top: int  # top log-probs per position
    token_ids: tuple[int, ...] | None  # ids whose log-probs are reported at every position
    ids: list[str]  # each prompt's request id (`rid`, else a new one): every streamed event's


class ServerApi(Api):
    """Every endpoint the reference server serves."""

    hot: Any = None  # reference/switch.HotSwitch in hot mode (set by server.build_api)

    def generate(self, data: object) -> dict[str, Any] | list[dict[str, Any]]:
        req = self.generate_request(data)
        results = []
        for i, spec in enumerate(req.specs):
            tic = time.perf_counter()
            results.append(self.generate_result(req, i, self.gen.run(spec), tic))
        return results if req.batched else results[0]

    def generate_request(self, data: object) -> GenerateRequest:
        """A /generate body checked: one generation per prompt (the streamed and the unstreamed
        answer share it)."""
        body = Body(data)
        body.get_bool("stream", False)  # a boolean (reference/stream_api.py streams `true`)
        prompts, batched = self._generate_prompts(body)
        sp = Body(body.get("sampling_params", {}), "`sampling_params`")
        unknown = sp.unknown(SAMPLING_PARAMS)
        if unknown:
            raise ApiError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        check_sampling(sp, GENERATE_UNSUPPORTED)
        requested = sp.get_int("max_new_tokens", 128, minimum=0)
        logprob = body.get_bool("return_logprob", False)
        start = body.get_int("logprob_start_len", -1, minimum=-1)
        top = body.get_int("top_logprobs_num", 0, minimum=0)
        token_ids = body.get_ints("token_ids_logprob")
        if token_ids is not None:
            self._prompt_ids(token_ids, "token_ids_logprob")
        specs = []
        for i, ids in enumerate(prompts):
            if logprob and start >= len(ids):
                raise ApiError(f"logprob_start_len ({start}) is higher than the number of input "
                               f"tokens ({len(ids)}). Request with a lower logprob_start_len.")
            specs.append(GenSpec(
                ids, self._max_new(len(ids), requested), **self._stops(sp),
                **sp.sampling("sampling_seed"),
                return_logprob=logprob, logprob_start_len=start,
                top_logprobs_num=top if logprob else 0,
                token_ids_logprob=token_ids if logprob else None,
                bootstrap=bootstrap_of(body, i),
            ))
        rid = body.get("rid")
        return GenerateRequest(body, specs, batched, top, token_ids,
                               [_rid(rid, i, batched) for i in range(len(specs))])

    def generate_result(self, req: GenerateRequest, index: int, out: GenOutput,
                        tic: float) -> dict[str, Any]:
        """SGLang's answer for one prompt: text, output ids, meta_info (a streamed snapshot
        has finish_reason null)."""
        spec, body = req.specs[index], req.body
        meta: dict[str, Any] = {
            "id": req.ids[index],
            "finish_reason": out.finish_reason or None,
            "prompt_tokens": len(spec.input_ids), "weight_version": WEIGHT_VERSION,
            "total_retractions": 0,
        }
        if spec.return_logprob:
            with_text = body.get_bool("return_text_in_logprobs", False)
            meta |= self._logprob_meta(out, req.top, req.token_ids, with_text)
        meta |= {"completion_tokens": len(out.output_ids), "cached_tokens": out.cached_tokens,
                 "e2e_latency": time.perf_counter() - tic}
        return {"text": out.text, "output_ids": out.output_ids, "meta_info": meta}

    def _generate_prompts(self, body: Body) -> tuple[list[tuple[int, ...]], bool]:
        text, ids = body.data.get("text"), body.data.get("input_ids")
        if (text is None) == (ids is None):
            raise ApiError("Either text or input_ids should be provided (exactly one).")
        if isinstance(text, str):
            return [self._encode(text, add_bos=True)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [self._encode(t, add_bos=True) for t in text], True
        if is_int_list(ids):
            return [self._prompt_ids(ids)], False
        if isinstance(ids, list) and ids and all(is_int_list(x) for x in ids):
            return [self._prompt_ids(x) for x in ids], True
        raise ApiError("`text` must be a string or a list of strings; `input_ids` a list of "
                       "token ids or a list of such lists")

    def _entry(self, lp: float | None, token_id: int, with_text: bool) -> list[Any]:
        return [lp, token_id, self.tok.token_text(token_id) if with_text else None]

    def _tops(self, alts: list[TopList | None], top: int, with_text: bool) -> list[Any]:
        return [None if a is None else [self._entry(finite(x), t, with_text) for t, x in a[:top]]
                for a in alts]

    def _chosen(self, alts: list[TopList | None], ids: tuple[int, ...], with_text: bool
                ) -> list[Any]:
        out: list[Any] = []
        for alt in alts:
            table = dict(alt) if alt is not None else None
            out.append(None if table is None else
                       [self._entry(finite(table[t]) if t in table else None, t, with_text)
                        for t in ids])
        return out

    def _logprob_meta(self, out: GenOutput, top: int, token_ids: tuple[int, ...] | None,
                      with_text: bool) -> dict[str, Any]:
        out_alts: list[TopList | None] = list(out.output_top)
        meta: dict[str, Any] = {
            "input_token_logprobs": [self._entry(lp, t, with_text)
                                     for lp, t in zip(out.input_logprobs, out.input_ids)],
            "output_token_logprobs": [self._entry(lp, t, with_text)
                                      for lp, t in zip(out.output_logprobs, out.output_ids)],
        }
        if top > 0:
            meta["input_top_logprobs"] = self._tops(out.input_top, top, with_text)
            meta["output_top_logprobs"] = self._tops(out_alts, top, with_text)
        if token_ids is not None:
            meta["input_token_ids_logprobs"] = self._chosen(out.input_top, token_ids, with_text)
            meta["output_token_ids_logprobs"] = self._chosen(out_alts, token_ids, with_text)
        return meta

    def tokenize(self, data: object) -> dict[str, Any]:
        body = Body(data)
        if ("prompt" in body) == ("messages" in body):
            raise ApiError("Exactly one of 'prompt' or 'messages' must be provided.")
        if "messages" in body:
            tokens: Any = list(self._chat_prompt(
                body, generation_prompt=body.get_bool("add_generation_prompt", True)))
            count: Any = len(tokens)
        else:
            add_bos = body.get_bool("add_special_tokens", True)
            prompt = body.data["prompt"]
            if isinstance(prompt, str):
                tokens = list(self._encode(prompt, add_bos=add_bos))
                count = len(tokens)
            elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
                tokens = [list(self._encode(p, add_bos=add_bos)) for p in prompt]
                count = [len(t) for t in tokens]
            else:
                raise ApiError("`prompt` must be a string or a list of strings")
        return {"tokens": tokens, "count": count, "max_model_len": self.cfg.max_model_len}

    def detokenize(self, data: object) -> dict[str, Any]:
        """SGLang's /detokenize: `tokens` (ids, or a list of id lists) -> `text` (a string or a
        list), `skip_special_tokens` default true. The same text is also under `prompt`, the
        key vLLM's /detokenize answers with, which lm-eval's remote tokenizer reads."""
        body = Body(data)
        tokens = body.data.get("tokens")
        skip = body.get_bool("skip_special_tokens", True)
        if is_int_list(tokens):
            text: Any = self._detokenize(tokens, skip)
        elif isinstance(tokens, list) and all(is_int_list(t) for t in tokens):
            text = [self._detokenize(t, skip) for t in tokens]
        else:
            raise ApiError("Invalid input: 'tokens' must be a list of integers or a list of "
                           "lists of integers.")
        return {"text": text, "prompt": text}

    def _detokenize(self, ids: list[int], skip_special_tokens: bool) -> str:
        try:
            return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)
        except ValueError as e:  # an id outside the vocabulary
            raise ApiError(str(e)) from None

    def tokenizer_info(self) -> dict[str, Any]:
        """vLLM's GET /tokenizer_info, which lm-eval's `tokenizer_backend=remote` requires
        (SGLang has no such route): the special tokens' text and the context length. No
        `chat_template`: the template is code (reference/chat.py), not Jinja, so a client that
        renders chats itself cannot; `/tokenize` with `messages` renders them here."""
        return {"tokenizer_class": "ByteTokenizer", "bos_token": self.tok.token_text(BOS_ID),
                "eos_token": self.tok.token_text(EOS_ID), "pad_token": self.tok.token_text(PAD_ID),
                "model_max_length": self.cfg.max_model_len, "vocab_size": self.tok.vocab_size}

    def models(self) -> dict[str, Any]:
        name = self.cfg.served_model_name
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "dsv4bisect",
            "root": name, "parent": None, "max_model_len": self.cfg.max_model_len,
        }]}

    def server_info(self) -> dict[str, Any]:
        """The settings, and the scheduler's running totals (`prefix_cache_hit_tokens`,
        `prefill_tokens_computed`, `peak_running_requests`, ...) and current load."""
        return dict(self.cfg.server_info) | self.gen.stats()

    def flush_cache(self) -> str:
        """SGLang's /flush_cache: empties the prefix cache. In hot mode a pending switch request
        is applied first (reference/switch.py; the switch drains the batch and flushes too)."""
        if self.hot is not None:
            self.hot.apply_pending()
        self.gen.flush_cache()
        return "Cache flushed.\n"

    def health_generate(self) -> None:
        """One real greedy token from `[bos]` (SGLang generates from `input_ids=[0]`; a PD
        server with its fake bootstrap host, transferring nothing)."""
        self.gen.run(GenSpec((BOS_ID,), max_new_tokens=1, bootstrap=FAKE_BOOTSTRAP))


def _rid(rid: object, index: int, batched: bool) -> str:
    if batched and isinstance(rid, list) and index < len(rid) and isinstance(rid[index], str):
        return rid[index]
    if not batched and isinstance(rid, str):
        return rid
    return new_id()
