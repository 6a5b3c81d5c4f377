"""`dsv4bisect router`: sglang-router's PD mode in front of the embedded prefill and decode
servers (torch-free).

Routing as sglang-router's PD router does it (and its `mini_lb.py`, which spells the same
protocol out in Python): for `/generate`, `/v1/chat/completions` and `/v1/completions` it picks
a prefill and a decode server by the policy, adds `bootstrap_host` (the prefill URL's host),
`bootstrap_port` (the prefill's bootstrap port) and a random 63-bit `bootstrap_room` (one per
prompt of a batched `/generate`), sends the request to both at once and answers with the decode
server's response; with `return_logprob` the prefill server's `input_token_logprobs`,
`input_top_logprobs` and `input_token_ids_logprobs` are put before the decode server's. An error
of the prefill server is answered in place of the decode server's (it is the cause; the decode
server only sees its transfer fail). `/flush_cache` and `/health_generate` go to every server,
`/server_info` gathers theirs (`{"internal_states", "prefill": [...], "decode": [...]}`, the
mini load balancer's shape); `/v1/models`, `/get_model_info` and the tokenizer routes go to the
first prefill server. Streaming is refused (a 400; the probe then asks the same request
plainly and reports no time to first token: probe/client.py).

Policies (`--policy`, per role with `--prefill-policy` / `--decode-policy`): `random`,
`round_robin`, `power_of_two` (the less loaded of two random servers, by requests in flight)
and `cache_aware` (the server whose recent requests share the longest prefix with this one when
the shared share exceeds `--cache-threshold`, else the least loaded; sglang-router keeps an
approximate radix tree per server, here the last requests' texts). With one server per role
every policy picks it.

It runs on the embedded server's HTTP stack (`reference/http_app.py`: limits, browser checks,
worker threads; `server.py`: bind, signals), as an API object with the engine API's handler
names.
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from dsv4bisect.reference.api import ApiConfig
from dsv4bisect.reference.pd.router_args import RouterArgs
from dsv4bisect.reference.request_body import ApiError

SGLANG_BOOTSTRAP_PORT = 8998  # a prefill server given with bootstrap port `none`: its default
LOGPROB_KEYS = ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs")
INFO_TIMEOUT_S = 10.0
RECENT = 256  # requests remembered per server by the cache-aware policy
POOL = 64  # connections per server (http_app's MAX_MODEL_REQUESTS requests in flight)
PREFILL_GRACE_S = 5.0  # how long the prefill server's answer is awaited after a decode error


def new_room() -> int:
    """A bootstrap room: a random 63-bit integer, as sglang-router draws it."""
    return random.randint(0, 2**63 - 1)


def bootstrap_host(url: str) -> str:
    host = urlsplit(url).hostname or ""
    return f"[{host}]" if ":" in host else host


class _Workers:
    """One role's servers, their requests in flight and the policy that picks one."""

    def __init__(self, urls: list[str], policy: str, threshold: float) -> None:
        self.urls, self.policy, self.threshold = urls, policy, threshold
        self.load = [0] * len(urls)
        self.recent: list[deque[str]] = [deque(maxlen=RECENT) for _ in urls]
        self._next = 0
        self._lock = threading.Lock()

    def pick(self, key: str) -> int:
        with self._lock:
            i = self._choose(key)
            self.load[i] += 1
            if self.policy == "cache_aware":
                self.recent[i].append(key)
            return i

    def done(self, i: int) -> None:
        with self._lock:
            self.load[i] -= 1

    def _choose(self, key: str) -> int:
        n = len(self.urls)
        if n == 1:
            return 0
        if self.policy == "random":
            return random.randrange(n)
        if self.policy == "round_robin":
            self._next = (self._next + 1) % n
            return self._next
        least = min(range(n), key=lambda i: self.load[i])
        if self.policy == "power_of_two":
            a, b = random.sample(range(n), 2)
            return a if self.load[a] <= self.load[b] else b
        best, share = least, 0.0  # cache_aware
        for i, texts in enumerate(self.recent):
            for text in texts:
                s = len(os.path.commonprefix([key, text])) / max(len(key), 1)
                if s > share:
                    best, share = i, s
        return best if share > self.threshold else least


class RouterApi:
    """The router's handlers, under the names http_app.HttpApp routes to."""

    hot = None

    def __init__(self, args: RouterArgs) -> None:
        self.args = args
        self.prefill = _Workers([u for u, _ in args.prefill], args.policy_of("prefill"),
                                args.cache_threshold)
        self.decode = _Workers(list(args.decode), args.policy_of("decode"),
                               args.cache_threshold)
        self.bootstrap_ports = [p or SGLANG_BOOTSTRAP_PORT for _, p in args.prefill]
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_connections=8, pool_maxsize=POOL)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self._legs = ThreadPoolExecutor(max_workers=POOL, thread_name_prefix="router-prefill")
        self._cfg: ApiConfig | None = None

    # ---- the PD routes ----------------------------------------------------------------------
    def generate(self, data: object) -> Any:
        body = self._body(data)
        prompts = body.get("text") if body.get("text") is not None else body.get("input_ids")
        batch = None
        if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int):
            batch = len(prompts)
        return self._pd("/generate", body, batch, merge=bool(body.get("return_logprob")))

    def chat(self, data: object) -> Any:
        return self._pd("/v1/chat/completions", self._body(data), None, merge=False)

    def completions(self, data: object) -> Any:
        return self._pd("/v1/completions", self._body(data), None, merge=False)

    def _pd(self, path: str, body: dict[str, Any], batch: int | None, *, merge: bool) -> Any:
        key = json.dumps(body.get("messages") or body.get("text") or body.get("prompt")
                         or body.get("input_ids"), sort_keys=True)
        p, d = self.prefill.pick(key), self.decode.pick(key)
        try:
            host, port = bootstrap_host(self.prefill.urls[p]), self.bootstrap_ports[p]
            if batch is None:
                extra: dict[str, Any] = {"bootstrap_host": host, "bootstrap_port": port,
                                         "bootstrap_room": new_room()}
            else:
                extra = {"bootstrap_host": [host] * batch, "bootstrap_port": [port] * batch,
                         "bootstrap_room": [new_room() for _ in range(batch)]}
            sent = {**body, **extra}
            leg = self._legs.submit(self._post, self.prefill.urls[p] + path, sent)
            decoded = self._post(self.decode.urls[d] + path, sent)
            try:  # a decode server that refused the request never fetches its state: the
                # prefill server would wait out its bootstrap timeout, the client need not
                prefilled = leg.result(timeout=PREFILL_GRACE_S if decoded[0] >= 400 else None)
            except FutureTimeout:
                prefilled = (200, None)
        finally:
            self.prefill.done(p)
            self.decode.done(d)
        for name, (status, answer) in (("prefill", prefilled), ("decode", decoded)):
            if status >= 400:
                raise ApiError(f"the {name} server answered {status}: {_message(answer)}",
                               status, "UpstreamError")
        return _merged(prefilled[1], decoded[1]) if merge else decoded[1]

    # ---- routes to every server ------------------------------------------------------------
    def flush_cache(self) -> str:
        for url in self._all():
            self._call("POST", url + "/flush_cache")
        return "Cache flushed.\n"

    def health_generate(self) -> None:
        for url in self._all():
            self._call("GET", url + "/health_generate")

    def server_info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prefill": [], "decode": [], "internal_states": []}
        for role, urls in (("prefill", self.prefill.urls), ("decode", self.decode.urls)):
            for url in urls:
                try:
                    info = self._call("GET", url + "/server_info", timeout=INFO_TIMEOUT_S)
                except ApiError as exc:
                    info = {"url": url, "error": exc.message}
                out[role].append(info)
                if role == "decode" and isinstance(info, dict):
                    out["internal_states"] += info.get("internal_states") or []
        out["router"] = {"policy": self.args.policy, "prefill_policy": self.prefill.policy,
                         "decode_policy": self.decode.policy, "pd_disaggregation": True}
        return out

    # ---- routes to the first prefill server -------------------------------------------------
    def models(self) -> Any:
        return self._call("GET", self.prefill.urls[0] + "/v1/models")

    def tokenize(self, data: object) -> Any:
        return self._call("POST", self.prefill.urls[0] + "/tokenize", data)

    def detokenize(self, data: object) -> Any:
        return self._call("POST", self.prefill.urls[0] + "/detokenize", data)

    def tokenizer_info(self) -> Any:
        return self._call("GET", self.prefill.urls[0] + "/tokenizer_info")

    @property
    def cfg(self) -> ApiConfig:
        """The first prefill server's settings (http_app's /get_model_info reads them)."""
        if self._cfg is None:
            info = self._call("GET", self.prefill.urls[0] + "/server_info")
            self._cfg = ApiConfig(str(info.get("served_model_name")),
                                  int(info.get("max_model_len") or 0), info)
        return self._cfg

    # ---- plumbing ---------------------------------------------------------------------------
    def _all(self) -> list[str]:
        return [*self.prefill.urls, *self.decode.urls]

    @staticmethod
    def _body(data: object) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise ApiError("request must be a JSON object")
        if data.get("stream"):
            raise ApiError("streaming is not supported by the embedded PD router")
        return data

    def _post(self, url: str, body: dict[str, Any]) -> tuple[int, Any]:
        try:
            r = self.session.post(url, json=body, timeout=self.args.request_timeout_secs)
        except requests.RequestException as exc:
            return 503, {"message": f"{url} is unreachable: {exc}"}
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, {"message": r.text[:300]}

    def _call(self, method: str, url: str, body: object = None,
              timeout: float | None = None) -> Any:
        try:
            r = self.session.request(method, url, json=body,
                                     timeout=timeout or self.args.request_timeout_secs)
        except requests.RequestException as exc:
            raise ApiError(f"{url} is unreachable: {exc}", 503, "ServiceUnavailableError"
                           ) from None
        if r.status_code >= 400:
            raise ApiError(f"{url} answered {r.status_code}: {r.text[:300]}", r.status_code,
                           "UpstreamError")
        try:
            return r.json()
        except ValueError:
            return r.text


def _message(answer: Any) -> str:
    if isinstance(answer, dict):
        err = answer.get("error")
        msg = answer.get("message") or (err.get("message") if isinstance(err, dict) else err)
        return str(msg)[:500]
    return str(answer)[:500]


def _merged(prefill: Any, decode: Any) -> Any:
    """The decode server's answer with the prefill server's input log-probs put first (per
    prompt of a batch)."""
    if isinstance(decode, list) and isinstance(prefill, list):
        return [_merged(p, d) for p, d in zip(prefill, decode, strict=False)]
    if not (isinstance(decode, dict) and isinstance(prefill, dict)):
        return decode
    meta, pmeta = decode.get("meta_info"), prefill.get("meta_info")
    if isinstance(meta, dict) and isinstance(pmeta, dict):
        for key in LOGPROB_KEYS:
            if isinstance(meta.get(key), list) and isinstance(pmeta.get(key), list):
                meta[key] = pmeta[key] + meta[key]
    return decode


def build_router(args: RouterArgs) -> Any:
    """The loader `reference.server.serve` calls (`loader(opts, port=)`)."""

    def load(opts: Any, *, port: int) -> RouterApi:
        del opts, port
        return RouterApi(args)

    return load
