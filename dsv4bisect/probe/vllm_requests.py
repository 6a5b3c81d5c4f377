"""The probe's requests to a vLLM server, checked against vLLM's own request models.

vLLM's OpenAI request models allow unknown fields and drop them with a log line
(`OpenAIBaseModel`, `extra="allow"`), so a misspelt or removed field would silently change what
the probe measures. Every body the probe sends over vLLM's API is checked here against the
fields of `CompletionRequest`, `ChatCompletionRequest`, `TokenizeChatRequest` and
`TokenizeCompletionRequest` of every verified release, as extracted from the wheels
(`base/vllm_releases.load_facts`): the field must exist and its value fit the field's type.
Also the bodies themselves (`completion`, `score`, `tokenize`): the one place that spells the
probe's vLLM requests. Pure; no HTTP here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dsv4bisect.base.vllm_releases import VERIFIED, fits, load_facts

MODELS = {"/v1/completions": "CompletionRequest", "/v1/chat/completions": "ChatCompletionRequest"}
GREEDY = {"temperature": 0, "top_p": 1, "top_k": -1}


def model_of(path: str, body: dict[str, Any]) -> str | None:
    if path == "/tokenize":
        return "TokenizeChatRequest" if "messages" in body else "TokenizeCompletionRequest"
    return MODELS.get(path)


def problems(path: str, body: dict[str, Any],
             releases: Sequence[str] = VERIFIED) -> list[str]:
    """Why vLLM would not take `body` as the probe means it, per release ([] when it would)."""
    model = model_of(path, body)
    if model is None:
        return []
    out = []
    for release in releases:
        spec = load_facts(release)["requests"].get(model)
        if spec is None:
            out.append(f"vLLM {release} has no {model}")
            continue
        fields = spec["fields"]
        for key, value in body.items():
            if key not in fields:
                out.append(f"vLLM {release}: {model} has no field `{key}` (vLLM would ignore it)")
                continue
            why = fits(fields[key]["type"], value)
            if why is not None:
                out.append(f"vLLM {release}: {model}.{key}: {why}")
    return out


def completion(model: str | None, input_ids: Sequence[int], max_tokens: int) -> dict[str, Any]:
    """Greedy continuation of token ids, returning them (`token_ids`)."""
    return _with_model(model, {"prompt": list(input_ids), "max_tokens": max_tokens, **GREEDY,
                               "return_token_ids": True})


def score(model: str | None, input_ids: Sequence[int], top_k: int,
          max_new_tokens: int) -> dict[str, Any]:
    """Teacher-forced log-probs of every prompt position with its top k (`prompt_logprobs`;
    vLLM has no start position, and needs at least one generated token)."""
    return _with_model(model, {"prompt": list(input_ids), "max_tokens": max(1, max_new_tokens),
                               **GREEDY, "prompt_logprobs": top_k})


def tokenize(model: str | None, messages: Sequence[dict[str, str]],
             thinking: bool = False) -> dict[str, Any]:
    """Chat-templated ids, with the template switches the probe's chats send."""
    return _with_model(model, {"messages": list(messages), "chat_template_kwargs": {
        "thinking": thinking, "enable_thinking": thinking}})


def _with_model(model: str | None, body: dict[str, Any]) -> dict[str, Any]:
    return body if model is None else {"model": model, **body}


def prompt_scores(data: Any, input_ids: Sequence[int], start: int, top_k: int
                  ) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
    """Positions > start (as SGLang reports from `logprob_start_len`: the position `start` itself
    carries none), the prompt token's log-prob there and the top k (by rank)
    from a completion's `prompt_logprobs` (keys are token ids as strings; a null logprob is a
    non-finite one). ValueError on anything else."""
    rows = data["choices"][0]["prompt_logprobs"]
    if not isinstance(rows, list) or len(rows) != len(input_ids):
        raise ValueError("prompt_logprobs do not cover the prompt")
    positions, lps, tops = [], [], []
    for i in range(start + 1, len(input_ids)):
        entry = rows[i]
        if not isinstance(entry, dict):
            raise ValueError(f"prompt_logprobs[{i}] is no object")
        own = entry.get(str(input_ids[i]))
        if not isinstance(own, dict):
            raise ValueError(f"prompt_logprobs[{i}] lacks the prompt token {input_ids[i]}")
        ranked = sorted(((v.get("rank"), int(k), v.get("logprob")) for k, v in entry.items()
                         if isinstance(v, dict) and isinstance(v.get("rank"), int)),
                        key=lambda r: r[0])
        positions.append(i)
        lps.append(_number(own.get("logprob")))
        tops.append([(t, _number(lp)) for rank, t, lp in ranked if 1 <= rank <= top_k])
    return positions, lps, tops


def _number(value: Any) -> float:
    if value is None:
        return float("nan")  # JSON cannot carry inf/NaN: the server wrote null
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"logprob {value!r} is no number")
    return float(value)


def error_message(data: Any) -> str | None:
    """The message of a vLLM error body (`{"error": {"message"}}`), SGLang's flat one, or
    FastAPI's `{"detail": ...}`."""
    if not isinstance(data, dict):
        return None
    err = data.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return f"{err['message']} ({err.get('type')})"
    for key in ("message", "detail"):
        if isinstance(data.get(key), str):
            return data[key]
    return None
