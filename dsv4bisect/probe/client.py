"""HTTP client for the probe: the same calls against SGLang and the embedded engine's server.

Every generation pins greedy decoding (temperature 0, top_p 1, top_k -1: SGLang otherwise
inherits the model's generation_config), thinking off via `chat_template_kwargs` (unless the
thinking arm asks for it), the served model name and a bounded `max_tokens`. The API key goes
in `Authorization: Bearer` and never into a message. Connection errors and 5xx are retried with
exponential backoff; a read timeout is not (a hung server would only multiply the wait).
Anything else unexpected is a `ProbeError` carrying an excerpt of the response.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from dsv4bisect.errors import ProbeError

EXCERPT = 300


class ProbeHTTPError(ProbeError):
    """The server answered with an HTTP error status."""

    def __init__(self, message: str, hint: str | None, status: int) -> None:
        super().__init__(message, hint)
        self.status = status


class ServerUnreachable(ProbeError):
    """No connection to the server after the retries (it may have crashed)."""


@dataclass(frozen=True)
class ServerInfo:
    model: str
    max_model_len: int | None
    compress_ratios: tuple[int, ...] | None  # None: the server did not say
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    latency_s: float


def find_key(data: Any, key: str) -> Any:
    """The first value stored under `key` anywhere in nested dicts/lists (breadth-first)."""
    queue = [data]
    while queue:
        item = queue.pop(0)
        if isinstance(item, dict):
            if key in item:
                return item[key]
            queue += list(item.values())
        elif isinstance(item, list):
            queue += item
    return None


class ProbeClient:
    """Blocking client for one server; not thread-safe: concurrent requests use one `clone()`
    per thread."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 120.0,
                 retries: int = 2, backoff_s: float = 0.5, model: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.model = model
        self._api_key = api_key
        self._session = requests.Session()
        if api_key:
            self._session.headers["Authorization"] = f"Bearer {api_key}"
        self._tokenize_messages: bool | None = None  # learnt on first use

    def close(self) -> None:
        self._session.close()

    def clone(self, timeout_s: float | None = None) -> ProbeClient:
        """Another client of the same server, settings and model, with its own connection (one
        per thread when the probe sends several requests at once), optionally another timeout."""
        return ProbeClient(self.url, api_key=self._api_key,
                           timeout_s=self.timeout_s if timeout_s is None else timeout_s,
                           retries=self.retries, backoff_s=self.backoff_s, model=self.model)

    # -- transport ---------------------------------------------------------------------------
    def _excerpt(self, text: str) -> str:
        text = text if len(text) <= EXCERPT else text[:EXCERPT] + "…"
        return text.replace(self._api_key, "***") if self._api_key else text

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                parse: bool = True) -> Any:
        """One call with bounded retries; returns parsed JSON (or the text when parse=False)."""
        where = f"{method} {self.url}{path}"
        attempt = 0
        while True:
            try:
                resp = self._session.request(method, self.url + path, json=body,
                                             timeout=(min(10.0, self.timeout_s), self.timeout_s))
            except requests.exceptions.ConnectionError as exc:
                if attempt < self.retries:
                    attempt += 1
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
                    continue
                raise ServerUnreachable(
                    f"{where}: cannot connect ({type(exc).__name__}) after {attempt + 1} attempts",
                    "check that the server is running and the URL is right") from exc
            except requests.exceptions.Timeout as exc:
                raise ProbeError(f"{where}: no response within {self.timeout_s:g} s",
                                 "the server is hung or too slow; raise the probe timeout if "
                                 "it is only slow") from exc
            except requests.exceptions.RequestException as exc:
                raise ProbeError(f"{where}: {type(exc).__name__}: {exc}") from exc
            if resp.status_code >= 500 and attempt < self.retries:
                attempt += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
                continue
            if resp.status_code >= 400:
                raise ProbeHTTPError(
                    f"{where}: HTTP {resp.status_code}: {self._excerpt(resp.text)}",
                    "the server refused the probe's request; see its log", resp.status_code)
            if not parse:
                return resp.text
            try:
                return resp.json()
            except ValueError as exc:
                raise ProbeError(f"{where}: malformed JSON response: {self._excerpt(resp.text)}",
                                 "the server is not an SGLang-compatible API") from exc

    def _malformed(self, path: str, data: Any, what: str) -> ProbeError:
        return ProbeError(f"POST {self.url}{path}: malformed response ({what}): "
                          f"{self._excerpt(json.dumps(data)[:EXCERPT * 2])}",
                          "the server is not an SGLang-compatible API")

    # -- server facts ------------------------------------------------------------------------
    def describe(self) -> ServerInfo:
        """Served model name and max length (/v1/models), compression ratios (/server_info)."""
        models = self.request("GET", "/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict) \
                or not isinstance(data[0].get("id"), str):
            raise self._malformed("/v1/models", models, "no data[0].id")
        info: dict[str, Any] = {}
        for path in ("/server_info", "/get_server_info"):
            try:
                info = self.request("GET", path)
                break
            except ProbeHTTPError:
                continue
        max_len = data[0].get("max_model_len") or find_key(info, "max_model_len")
        ratios = find_key(info, "compress_ratios")
        ratios_t = tuple(int(r) for r in ratios) if isinstance(ratios, list) else None
        self.model = self.model or data[0]["id"]
        return ServerInfo(self.model, int(max_len) if max_len else None, ratios_t,
                          info if isinstance(info, dict) else {})

    def flush_cache(self) -> None:
        self.request("POST", "/flush_cache", parse=False)

    # -- token counts ------------------------------------------------------------------------
    def tokenize_messages(self, messages: Sequence[dict[str, str]]) -> list[int] | None:
        """Chat-templated token ids via /tokenize {messages}; None if the server cannot."""
        if self._tokenize_messages is False:
            return None
        try:
            data = self.request("POST", "/tokenize", {"messages": list(messages)})
        except ProbeHTTPError as exc:
            if exc.status in (400, 404, 405, 422):
                self._tokenize_messages = False
                return None
            raise
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise self._malformed("/tokenize", data, "no integer `tokens`")
        self._tokenize_messages = True
        return tokens

    def count(self, messages: Sequence[dict[str, str]]) -> int:
        """The prompt length of `messages` in the server's tokens."""
        tokens = self.tokenize_messages(messages)
        if tokens is not None:
            return len(tokens)
        return self.chat(messages, max_tokens=1).prompt_tokens

    # -- generation --------------------------------------------------------------------------
    def chat(self, messages: Sequence[dict[str, str]], *, max_tokens: int,
             thinking: bool = False) -> ChatResult:
        body: dict[str, Any] = {
            "model": self.model, "messages": list(messages), "max_tokens": max_tokens,
            "temperature": 0, "top_p": 1, "top_k": -1, "stream": False,
            "chat_template_kwargs": {"thinking": thinking, "enable_thinking": thinking},
        }
        if body["model"] is None:
            del body["model"]
        t0 = time.perf_counter()
        data = self.request("POST", "/v1/chat/completions", body)
        latency = time.perf_counter() - t0
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            usage = data["usage"]
            return ChatResult(str(text), int(usage["prompt_tokens"]),
                              int(usage.get("completion_tokens") or 0),
                              choice.get("finish_reason"), latency)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise self._malformed("/v1/chat/completions", data, f"{type(exc).__name__} {exc}") \
                from exc

    def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        data = self.request("POST", "/generate", body)
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
            raise self._malformed("/generate", data, "no meta_info")
        return data

    def generate(self, input_ids: Sequence[int], *, max_new_tokens: int) -> list[int]:
        """Greedy continuation ids of `input_ids` (SGLang native /generate)."""
        data = self._generate({
            "input_ids": list(input_ids), "return_logprob": True, "logprob_start_len": -1,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "top_p": 1,
                                "top_k": -1}})
        ids = data.get("output_ids")
        if ids is None:
            ids = [e[1] for e in data["meta_info"].get("output_token_logprobs") or []]
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise self._malformed("/generate", data, "no integer output_ids")
        return ids

    def score(self, input_ids: Sequence[int], *, start: int, top_k: int
              ) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
        """Teacher-forced logprobs of input_ids[start:] and the top-k at each position."""
        data = self._generate({
            "input_ids": list(input_ids), "return_logprob": True, "logprob_start_len": start,
            "top_logprobs_num": top_k,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0}})
        meta = data["meta_info"]
        lps, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
        if not isinstance(lps, list) or not isinstance(tops, list) or len(lps) != len(tops) \
                or len(lps) != len(input_ids) - start:
            raise self._malformed("/generate", data, "input logprobs do not cover the positions")
        positions, token_lps, top_out = [], [], []
        for i, (entry, top) in enumerate(zip(lps, tops)):
            if entry is None or entry[0] is None or not top:
                continue  # the first input position has no logprob
            positions.append(start + i)
            token_lps.append(float(entry[0]))
            top_out.append([(int(t[1]), float(t[0])) for t in top if t and t[0] is not None])
        return positions, token_lps, top_out
