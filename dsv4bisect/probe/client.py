"""HTTP client for the probe: the same calls against SGLang and the embedded engine's server.

Every generation pins greedy decoding (temperature 0, top_p 1, top_k -1: SGLang otherwise
inherits the model's generation_config), thinking off via `chat_template_kwargs` (unless the
thinking arm asks for it), the served model name and a bounded `max_tokens`. The API key goes
in `Authorization: Bearer` and never into a message. Connection errors and 5xx are retried with
exponential backoff; a read timeout is not (a hung server would only multiply the wait), and
neither is a body cut short that then stalls. `timeout_s` is a wall-clock deadline per request
(connect, headers and body together): a server that trickles its answer a byte at a time would
otherwise reset a per-read timeout for as long as it likes, so a timer shuts the request's
socket down at the deadline (`_Deadline`). Anything else unexpected is a `ProbeError` carrying
an excerpt of the response.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import requests
import urllib3
from requests.adapters import HTTPAdapter

from dsv4bisect.errors import ProbeError
from dsv4bisect.probe import vllm_requests as vr
from dsv4bisect.probe.drift import NonFiniteScores
from dsv4bisect.probe.stream import StreamError, StreamTiming, read_chat_stream

EXCERPT = 300
T = TypeVar("T")
R = TypeVar("R")
MAX_MODEL_LEN = 2 ** 24  # tokens: the profiles' length limit (docs/profiles.md § Ranges)


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
    sliding_window: int | None = None  # the SWA window in tokens; None: the server did not say


@dataclass(frozen=True)
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    latency_s: float
    # prompt tokens the server's prefix cache supplied (`usage.prompt_tokens_details.
    # cached_tokens`, SGLang with --enable-cache-report); None where it does not say
    cached_tokens: int | None = None
    # a streamed answer's time to first token and mean inter-token latency over its `itl_n`
    # gaps (probe/stream.py); None: not streamed, or no text
    ttft_s: float | None = None
    itl_s: float | None = None
    itl_n: int = 0


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


def _count(value: Any) -> int:
    """A token count from a response: a non-negative JSON integer (a float, a string or a bool
    is a malformed response, not a number to round)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"token count {value!r} is no non-negative integer")
    return value


def chat_body(model: str | None, messages: Sequence[dict[str, str]], max_tokens: int,
              thinking: bool, stream: bool = False) -> dict[str, Any]:
    """The probe's chat request (the same on SGLang and vLLM: both take these fields).
    `stream`: as SGLang's users ask (server-sent events, usage in the last chunk)."""
    body: dict[str, Any] = {
        "model": model, "messages": list(messages), "max_tokens": max_tokens,
        "temperature": 0, "top_p": 1, "top_k": -1, "stream": stream,
        "chat_template_kwargs": {"thinking": thinking, "enable_thinking": thinking},
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if model is None:
        del body["model"]
    return body


class _Deadline:
    """The sockets of one client's connections, shut down when a request's deadline passes.

    The connection classes register each socket they open; `arm(seconds)` starts a timer that
    shuts every registered socket down (a blocked `recv` then returns at once), `disarm()`
    stops it and says whether it fired. The client sends one request at a time, so every
    registered socket belongs to the request in flight or is idle in the pool."""

    def __init__(self) -> None:
        # Sockets, not connections: http.client drops `conn.sock` once a response that closes
        # the connection has its headers, while the body still streams from the socket.
        self.sockets: list[socket.socket] = []
        self._timer: threading.Timer | None = None
        self.fired = False

    def adapter(self) -> HTTPAdapter:
        deadline = self

        class Conn(urllib3.connection.HTTPConnection):
            def connect(self) -> None:
                super().connect()
                deadline.register(self.sock)

        class SConn(urllib3.connection.HTTPSConnection):
            def connect(self) -> None:
                super().connect()
                deadline.register(self.sock)

        class Pool(urllib3.HTTPConnectionPool):
            ConnectionCls = Conn

        class SPool(urllib3.HTTPSConnectionPool):
            ConnectionCls = SConn

        adapter = HTTPAdapter(max_retries=0)
        adapter.poolmanager.pool_classes_by_scheme = {"http": Pool, "https": SPool}
        return adapter

    def register(self, sock: socket.socket | None) -> None:
        if sock is not None:
            self.sockets = [s for s in self.sockets if s.fileno() != -1] + [sock]

    def arm(self, seconds: float) -> None:
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> bool:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return self.fired

    def _fire(self) -> None:
        self.fired = True
        for sock in list(self.sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed


def _read_timeout(exc: BaseException) -> bool:
    """A ConnectionError that is really a read timeout mid-body (requests wraps urllib3's
    ReadTimeoutError raised while the body streams in)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, urllib3.exceptions.ReadTimeoutError | TimeoutError | socket.timeout):
            return True
        args = getattr(seen, "args", ())
        nested = next((a for a in args if isinstance(a, BaseException)), None)
        seen = getattr(seen, "reason", None) or nested or seen.__cause__ or seen.__context__
    return False


class ProbeClient:
    """Blocking client for one server; not thread-safe: concurrent requests use one `clone()`
    per thread."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 120.0,
                 retries: int = 2, backoff_s: float = 0.5, model: str | None = None,
                 api: str | None = None) -> None:
        self.url = url.rstrip("/")
        # whose API the server speaks: sglang | vllm; None: learnt from /v1/models (vLLM's
        # model cards say `owned_by: vllm`) at the first call that needs it
        self.api = api
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.model = model
        self._api_key = api_key
        self._session = requests.Session()
        self._deadline = _Deadline()
        adapter = self._deadline.adapter()
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        if api_key:
            self._session.headers["Authorization"] = f"Bearer {api_key}"
        self._tokenize_messages: bool | None = None  # learnt on first use
        # whether the server streams a chat answer (None: not asked yet; learnt at the first
        # streamed chat: a server that refuses the streamed request with a 400 and answers
        # the same request plainly does not stream, e.g. the embedded PD router)
        self.streams: bool | None = None

    def close(self) -> None:
        self._session.close()

    def clone(self, timeout_s: float | None = None) -> ProbeClient:
        """Another client of the same server, settings and model, with its own connection (one
        per thread when the probe sends several requests at once), optionally another timeout."""
        other = ProbeClient(self.url, api_key=self._api_key,
                            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
                            retries=self.retries, backoff_s=self.backoff_s, model=self.model,
                            api=self.api)
        other.streams = self.streams
        return other

    def vllm(self) -> bool:
        """Whether the server speaks vLLM's API (asked once, from /v1/models; a server that
        cannot say is taken for SGLang's, whose routes then answer for themselves)."""
        if self.api is None:
            try:
                self._learn_api(self.request("GET", "/v1/models"))
            except ProbeError:
                self.api = "sglang"
        return self.api == "vllm"

    def _learn_api(self, models: Any) -> None:
        if self.api is None:
            data = models.get("data") if isinstance(models, dict) else None
            card = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) \
                else {}
            self.api = "vllm" if card.get("owned_by") == "vllm" else "sglang"

    # -- transport ---------------------------------------------------------------------------
    def _excerpt(self, text: str) -> str:
        text = text if len(text) <= EXCERPT else text[:EXCERPT] + "…"
        return text.replace(self._api_key, "***") if self._api_key else text

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                parse: bool = True) -> Any:
        """One call with bounded retries; returns parsed JSON (or the text when parse=False).
        A body for a vLLM server must fit vLLM's request models (`vllm_requests.problems`)."""
        resp = self._send(method, path, body)
        if not parse:
            return resp.text
        return self._json(resp, f"{method} {self.url}{path}")

    def _json(self, resp: requests.Response, where: str) -> Any:
        try:
            return resp.json()
        except ValueError as exc:
            raise ProbeError(f"{where}: malformed JSON response: {self._excerpt(resp.text)}",
                             "the server is not an SGLang- or vLLM-compatible API") from exc

    def _send(self, method: str, path: str, body: dict[str, Any] | None = None, *,
              stream: bool = False) -> requests.Response:
        """The response of one call with bounded retries (an error status raised). `stream`:
        its body is still to be read, and the deadline still armed: `_disarm` after reading."""
        where = f"{method} {self.url}{path}"
        if body is not None and self.api == "vllm":
            wrong = vr.problems(path.partition("?")[0], body)
            if wrong:
                raise ProbeError(f"{where}: the probe's request does not fit vLLM's request "
                                 f"model: {wrong[0]}" + (f" (+{len(wrong) - 1} more)"
                                                          if len(wrong) > 1 else ""),
                                 "a dsv4bisect bug: report it with the vLLM release")
        attempt = 0
        while True:
            self._deadline.arm(self.timeout_s)
            try:
                resp = self._session.request(method, self.url + path, json=body, stream=stream,
                                             timeout=(min(10.0, self.timeout_s), self.timeout_s))
            except requests.exceptions.RequestException as exc:
                timed_out = self._deadline.disarm() or isinstance(
                    exc, requests.exceptions.Timeout) or _read_timeout(exc)
                if timed_out:
                    raise self._timed_out(where) from exc
                if isinstance(exc, requests.exceptions.ConnectionError):
                    if attempt < self.retries:
                        attempt += 1
                        time.sleep(self.backoff_s * 2 ** (attempt - 1))
                        continue
                    raise ServerUnreachable(
                        f"{where}: cannot connect ({type(exc).__name__}) after {attempt + 1} "
                        "attempts", "check that the server is running and the URL is right"
                    ) from exc
                raise ProbeError(f"{where}: {type(exc).__name__}: {exc}",
                                 "check the URL and that an HTTP server answers there") from exc
            if not stream or resp.status_code >= 400:
                self._deadline.disarm()
            if resp.status_code >= 500 and attempt < self.retries:
                attempt += 1
                resp.close()
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
                continue
            if resp.status_code >= 400:
                try:  # vLLM's {"error": {"message", "type"}}, SGLang's flat shape, FastAPI's
                    said = vr.error_message(resp.json())
                except ValueError:
                    said = None
                raise ProbeHTTPError(
                    f"{where}: HTTP {resp.status_code}: {self._excerpt(said or resp.text)}",
                    "the server refused the probe's request; see its log", resp.status_code)
            return resp

    def _timed_out(self, where: str) -> ProbeError:
        return ProbeError(f"{where}: no response within {self.timeout_s:g} s (a deadline for "
                          "the whole request)", "the server is hung or too slow; raise the "
                          "probe timeout if it is only slow")

    def _malformed(self, path: str, data: Any, what: str) -> ProbeError:
        return ProbeError(f"POST {self.url}{path}: malformed response ({what}): "
                          f"{self._excerpt(json.dumps(data)[:EXCERPT * 2])}",
                          "the server is not an SGLang- or vLLM-compatible API")

    # -- server facts ------------------------------------------------------------------------
    def describe(self) -> ServerInfo:
        """Served model name and max length (/v1/models), compression ratios (/server_info)."""
        models = self.request("GET", "/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict) \
                or not isinstance(data[0].get("id"), str):
            raise self._malformed("/v1/models", models, "no data[0].id")
        self._learn_api(models)
        info: dict[str, Any] = {}
        # vLLM: /server_info exists in dev mode (VLLM_SERVER_DEV_MODE=1, set by the vllm kind)
        paths = ("/server_info?config_format=json",) if self.api == "vllm" else \
            ("/server_info", "/get_server_info")
        for path in paths:
            try:
                info = self.request("GET", path)
                break
            except ProbeHTTPError:
                continue
        if not isinstance(info, dict):
            raise self._malformed("/server_info", info, "not a JSON object")
        max_len = data[0].get("max_model_len")
        max_len = find_key(info, "max_model_len") if max_len is None else max_len
        ratios = find_key(info, "compress_ratios")
        self.model = self.model or data[0]["id"]
        return ServerInfo(self.model, self._max_len(max_len, info), self._ratios(ratios, info),
                          info, self._window(find_key(info, "sliding_window"), info))

    def _window(self, value: Any, info: Any) -> int | None:
        """sliding_window: absent, or an integer in [1, 2**20]."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2 ** 20:
            raise self._malformed("/server_info", info,
                                  "sliding_window is not an integer in [1, 2**20]")
        return value

    def _max_len(self, value: Any, info: Any) -> int | None:
        """max_model_len: absent, or an integer in [1, MAX_MODEL_LEN] (a negative, zero or
        astronomically large length would silently change which probe lengths run)."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) \
                or not 1 <= value <= MAX_MODEL_LEN:
            raise ProbeError(f"GET {self.url}: max_model_len {str(value)[:40]!r} is not an "
                             f"integer in [1, {MAX_MODEL_LEN}]",
                             "the server is not an SGLang- or vLLM-compatible API")
        return value

    def _ratios(self, value: Any, info: Any) -> tuple[int, ...] | None:
        """compress_ratios: absent, or a list of integers in [0, 2**20] (0: a dense layer)."""
        if value is None:
            return None
        if not isinstance(value, list) or len(value) > 4096 or not all(
                isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= 2 ** 20
                for r in value):
            raise self._malformed("/server_info", info,
                                  "compress_ratios is not a list of integers in [0, 2**20]")
        return tuple(value)

    def flush_cache(self) -> None:
        if self.api is None:  # SGLang's route first (one request, as before); vLLM's on a 404
            try:
                self.request("POST", "/flush_cache", parse=False)
                self.api = self.api or "sglang"
                return
            except ProbeHTTPError as exc:
                if exc.status != 404 or not self.vllm():
                    raise
        if self.vllm():  # vLLM's dev-mode route
            try:
                self.request("POST", "/reset_prefix_cache", parse=False)
            except ProbeHTTPError as exc:
                if exc.status != 404:
                    raise
                raise ProbeError(f"{self.url}: vLLM has no /reset_prefix_cache",
                                 "start vLLM with VLLM_SERVER_DEV_MODE=1 (the vllm kind sets "
                                 "it): the probe empties the prefix cache between cases") from exc
            return
        self.request("POST", "/flush_cache", parse=False)

    # -- token counts ------------------------------------------------------------------------
    def tokenize_messages(self, messages: Sequence[dict[str, str]]) -> list[int] | None:
        """Chat-templated token ids via /tokenize {messages}; None if the server cannot."""
        if self._tokenize_messages is False:
            return None
        body = vr.tokenize(self.model, messages) if self.vllm() else \
            {"messages": list(messages)}
        try:
            data = self.request("POST", "/tokenize", body)
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
             thinking: bool = False, stream: bool = False) -> ChatResult:
        """One greedy chat answer. `stream`: asked for as SGLang's users ask (server-sent
        events, probe/stream.py), which also times its first token and the gaps after it."""
        stream = stream and self.streams is not False
        body = chat_body(self.model, messages, max_tokens, thinking, stream)
        t0 = time.perf_counter()
        timing = None
        if stream:
            try:
                data, timing = self._chat_stream(body, t0)
            except ProbeHTTPError as exc:
                if exc.status != 400 or self.streams:
                    raise
                t0 = time.perf_counter()  # the same request, plain: its answer, untimed
                data = self.request("POST", "/v1/chat/completions",
                                    chat_body(self.model, messages, max_tokens, thinking))
            if timing is not None:
                self.streams = True
            elif self.streams is None:  # answered plainly: ask it plainly from now on
                self.streams = False
        else:
            data = self.request("POST", "/v1/chat/completions", body)
        latency = time.perf_counter() - t0
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            usage = data["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            return ChatResult(str(text), _count(usage["prompt_tokens"]),
                              _count(usage.get("completion_tokens") or 0),
                              choice.get("finish_reason"), latency,
                              None if cached is None else _count(cached),
                              timing.ttft_s if timing else None,
                              timing.itl_s if timing else None,
                              len(timing.gaps_s) if timing else 0)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError,
                OverflowError) as exc:
            raise self._malformed("/v1/chat/completions", data, f"{type(exc).__name__} {exc}") \
                from exc

    def _chat_stream(self, body: dict[str, Any], t0: float
                     ) -> tuple[Any, StreamTiming | None]:
        """A streamed chat's answer and timing; a server that answers with plain JSON instead
        (it does not stream) is read as such, untimed."""
        where = f"POST {self.url}/v1/chat/completions"
        resp = self._send("POST", "/v1/chat/completions", body, stream=True)
        try:
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                return self._json(resp, where), None
            try:
                return read_chat_stream(resp.iter_lines(), t0)
            except requests.exceptions.RequestException as exc:
                if self._deadline.disarm() or _read_timeout(exc):
                    raise self._timed_out(where) from exc
                raise ProbeError(f"{where}: the stream broke off ({type(exc).__name__})",
                                 "the server closed the connection mid-answer; see its log"
                                 ) from exc
            except (StreamError, ValueError) as exc:
                if self._deadline.fired:
                    raise self._timed_out(where) from exc
                raise ProbeError(f"{where}: malformed event stream: {exc}",
                                 "the server is not an SGLang- or vLLM-compatible API") from exc
        finally:
            self._deadline.disarm()
            resp.close()

    def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        data = self.request("POST", "/generate", body)
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
            raise self._malformed("/generate", data, "no meta_info")
        return data

    def generate(self, input_ids: Sequence[int], *, max_new_tokens: int) -> list[int]:
        """Greedy continuation ids of `input_ids` (SGLang native /generate; vLLM's
        /v1/completions with `return_token_ids`)."""
        if self.vllm():
            data = self.request("POST", "/v1/completions",
                                vr.completion(self.model, input_ids, max_new_tokens))
            try:
                ids = data["choices"][0]["token_ids"]
            except (KeyError, IndexError, TypeError) as exc:
                raise self._malformed("/v1/completions", data, "no choices[0].token_ids") \
                    from exc
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                raise self._malformed("/v1/completions", data, "no integer token_ids")
            return ids
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

    def score(self, input_ids: Sequence[int], *, start: int, top_k: int, max_new_tokens: int = 0
              ) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
        """Teacher-forced logprobs of input_ids[start:] and the top-k at each position.
        `max_new_tokens` 1: the request also generates a token (greedy), so it is an ordinary
        prompt the server caches whole (the null model's re-chunked arm: `runner.null_arms`).
        vLLM: `prompt_logprobs` over the whole prompt (no start position; such a request does
        not read the prefix cache), positions before `start` dropped."""
        if self.vllm():
            return self._score_vllm(input_ids, start, top_k, max_new_tokens)
        data = self._generate({
            "input_ids": list(input_ids), "return_logprob": True, "logprob_start_len": start,
            "top_logprobs_num": top_k,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
        meta = data["meta_info"]
        lps, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
        if not isinstance(lps, list) or not isinstance(tops, list) or len(lps) != len(tops) \
                or len(lps) != len(input_ids) - start:
            raise self._malformed("/generate", data, "input logprobs do not cover the positions")
        positions, token_lps, top_out = [], [], []
        for i, (entry, top) in enumerate(zip(lps, tops)):
            if entry is None or (isinstance(entry, list) and entry and entry[0] is None) \
                    or not top:
                continue  # the first input position has no logprob
            if not isinstance(entry, list) or not entry:
                raise self._malformed("/generate", data, f"input_token_logprobs[{i}] is no list")
            if not isinstance(top, list):
                raise self._malformed("/generate", data, f"input_top_logprobs[{i}] is no list")
            positions.append(start + i)
            token_lps.append(self._logprob(entry[0], data, f"input_token_logprobs[{i}]"))
            top_out.append([(self._token_id(t[1], data, f"input_top_logprobs[{i}]"),
                             self._logprob(t[0], data, f"input_top_logprobs[{i}]"))
                            for t in top if isinstance(t, list) and len(t) >= 2
                            and t[0] is not None])
        self._finite("/generate", positions, token_lps, top_out)
        return positions, token_lps, top_out

    def _finite(self, path: str, positions: list[int], lps: list[float],
                tops: list[list[tuple[int, float]]]) -> None:
        """NonFiniteScores when a scored log-prob (or a top one) is NaN or infinite."""
        bad = [(p, lp) for p, at, top in zip(positions, lps, tops)
               for lp in (at, *(x for _, x in top)) if not math.isfinite(lp)]
        if bad:
            raise NonFiniteScores(
                f"POST {self.url}{path}: {len(bad)} non-finite logprobs, the first "
                f"{bad[0][1]!r} at position {bad[0][0]}",
                "the configuration computes NaN/inf logits (a NaN decode, sglang#25704)")

    def _score_vllm(self, input_ids: Sequence[int], start: int, top_k: int,
                    max_new_tokens: int
                    ) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
        data = self.request("POST", "/v1/completions",
                            vr.score(self.model, input_ids, top_k, max_new_tokens))
        try:
            positions, lps, tops = vr.prompt_scores(data, input_ids, start, top_k)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise self._malformed("/v1/completions", data, f"prompt_logprobs: {exc}") from exc
        self._finite("/v1/completions", positions, lps, tops)
        return positions, lps, tops

    def _logprob(self, value: Any, data: Any, where: str) -> float:
        """A logprob: a JSON number (NaN/±inf pass here: the caller judges them)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._malformed("/generate", data, f"{where}: logprob {value!r} is no number")
        return float(value)

    def _token_id(self, value: Any, data: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._malformed("/generate", data, f"{where}: token id {value!r} is no integer")
        return value


def map_on_clones(client: ProbeClient, work: Callable[[ProbeClient, T], R], items: Sequence[T],
                  level: int, timeout_s: float, name: str) -> list[R]:
    """`work(connection, item)` for every item, `level` at once, each worker thread on a
    connection of its own (a clone of `client`, closed at the end); the results in `items`'
    order."""
    local, lock = threading.local(), threading.Lock()
    clones: list[ProbeClient] = []

    def one(item: T) -> R:
        if not hasattr(local, "client"):
            local.client = client.clone(timeout_s=timeout_s)
            with lock:
                clones.append(local.client)
        return work(local.client, item)

    try:
        with ThreadPoolExecutor(max_workers=level, thread_name_prefix=name) as pool:
            return list(pool.map(one, items))
    finally:
        for c in clones:
            c.close()
