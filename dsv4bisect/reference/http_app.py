"""The embedded server's HTTP application: SGLang's routes on Starlette.

SGLang serves its API from a FastAPI app (`entrypoints/http_server.py`) on uvicorn; this is the
same shape on the same stack (Starlette is FastAPI's core): one ASGI app, a route per endpoint,
blocking work handed to threads. What a local engine adds around the endpoint logic
(`native_api.ServerApi`, request-JSON to reply-JSON):

- Browsers: a foreign `Origin` (or, bound to loopback, a foreign `Host`) is 403 on every route, a
  JSON route's body must be declared JSON (415), and a state-changing route takes POST only
  (`csrf.py`: 405 for a GET, which a page can send without an Origin), so a web page cannot
  drive the engine.
- Size and load: a body over MAX_BODY_BYTES is 413 (by `Content-Length` before reading, and
  counted while reading); more than MAX_MODEL_REQUESTS model requests in flight is 503 at once;
  the log-prob entries a reply would hold are bounded per request (400) and across the requests
  in flight (503; `response_bound.py`).
- Model work runs in worker threads (`anyio.to_thread`, one per admitted request: the engine
  decides what runs together, the transport serialises nothing). A `StopCheck` polled between
  model steps (`reference/cancel.py`) cancels it when the client hangs up (the ASGI
  `http.disconnect` message) or the server stops (503).
- One log line per request on the `dsv4bisect.reference.server` logger; no traceback reaches a
  client (500 only for a server bug, logged).
- `"stream": true` on a model route is answered by `reference/event_stream.py` (server-sent
  events as the engine makes them; the same admission, threads and disconnect cancelling).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route as StarletteRoute
from starlette.types import Message, Receive, Scope, Send

from dsv4bisect.errors import Dsv4BisectError
from dsv4bisect.reference import csrf, response_bound
from dsv4bisect.reference.cancel import Cancelled, stop_when
from dsv4bisect.reference.http_reply import (
    CANCELLED_KEY,
    Reply,
    as_response,
    error_reply,
    watch_disconnect,
)
from dsv4bisect.reference.http_state import ServerState
from dsv4bisect.reference.native_api import ServerApi
from dsv4bisect.reference.request_body import ApiError, parse_json
from dsv4bisect.reference.vllm_api import VLLM_ROUTES

if TYPE_CHECKING:
    from dsv4bisect.reference.event_stream import EventStream

log = logging.getLogger("dsv4bisect.reference.server")
T = TypeVar("T")

MAX_BODY_BYTES = 64 << 20
MAX_MODEL_REQUESTS = 64  # model requests in flight (running or waiting for the engine); then 503
MAX_LIGHT_REQUESTS = 64  # the same for every other route
LIGHT_THREADS = 8  # threads for the light routes (tokenize, info): fast, never take the engine
BODY_TIMEOUT_S = 60.0  # from the end of the head to the end of the body (64 MiB: 1 MB/s)
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# routes whose handler runs the model: the MAX_MODEL_REQUESTS bound, cancelled on disconnect
MODEL_HANDLERS = frozenset({"chat", "completions", "generate", "health_generate"})


@dataclass(frozen=True)
class Route:
    methods: tuple[str, ...]
    handler: str  # method name on the server (health, ...) or on ServerApi
    json_body: bool = False


ROUTES: dict[str, Route] = {
    "/health": Route(("GET",), "health"),
    "/health_generate": Route(("GET",), "health_generate"),
    "/v1/models": Route(("GET",), "models"),
    "/server_info": Route(("GET",), "server_info"),
    "/get_server_info": Route(("GET",), "server_info"),
    "/get_model_info": Route(("GET",), "model_info"),
    "/flush_cache": Route(csrf.METHODS, "flush_cache"),  # SGLang's takes GET too: csrf.py
    "/v1/chat/completions": Route(("POST",), "chat", json_body=True),
    "/v1/completions": Route(("POST",), "completions", json_body=True),
    "/generate": Route(("POST", "PUT"), "generate", json_body=True),
    "/tokenize": Route(("POST",), "tokenize", json_body=True),
    "/v1/tokenize": Route(("POST",), "tokenize", json_body=True),
    "/detokenize": Route(("POST",), "detokenize", json_body=True),
    "/v1/detokenize": Route(("POST",), "detokenize", json_body=True),
    "/tokenizer_info": Route(("GET",), "tokenizer_info"),
}


class HttpApp:
    """The ASGI app uvicorn runs: the checks every request gets, then Starlette's routing."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        # created on the event loop (anyio wants one running); one thread per admitted request
        self.model_limiter = anyio.CapacityLimiter(MAX_MODEL_REQUESTS)
        self.light_limiter = anyio.CapacityLimiter(LIGHT_THREADS)
        routes = ROUTES if state.api_kind != "vllm" else {
            path: Route(*spec) for path, spec in VLLM_ROUTES.items()}
        self.paths = frozenset(routes)
        self.router = Starlette(
            routes=[StarletteRoute(path, self._endpoint(route), methods=list(route.methods))
                    for path, route in routes.items()],
            exception_handlers={HTTPException: self._http_error},
        )
        self.router.router.redirect_slashes = False  # `/health/` is a 404, as before

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off; nothing else is served
            return
        tic = time.perf_counter()
        status = [0]

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await as_response(refusal, self.state)(scope, receive, send_logged)
        else:
            await self.router(scope, receive, send_logged)
        ms = (time.perf_counter() - tic) * 1e3
        method, path = scope["method"], scope["path"]
        if scope.get(CANCELLED_KEY):
            log.info("%s %s 499 %.1fms (client disconnected: generation cancelled)", method,
                     path, ms)
        else:
            log.info("%s %s %d %.1fms", method, path, status[0], ms)

    def _refusal(self, scope: Scope) -> Reply | None:
        """What is wrong with the request head, in the order the old transport checked it."""
        headers: dict[str, list[str]] = {}
        for key, value in scope["headers"]:
            headers.setdefault(key.decode("latin-1"), []).append(value.decode("latin-1"))
        for name in ("origin", "content-type"):  # the checks below read the first one
            if len(headers.get(name, ())) > 1:
                return error_reply(400, f"more than one {name.title()} header", "BadRequestError",
                                   close=True)
        if "transfer-encoding" in headers:
            return error_reply(411, "send the body with Content-Length (chunked request bodies "
                               "are not supported)", "LengthRequiredError", close=True)
        length = headers.get("content-length", [""])[0]  # h11 refused bad or conflicting ones
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return _too_large()
        origin = headers.get("origin", [None])[0]
        if origin is not None and not _local_origin(origin):
            return error_reply(403, f"cross-origin request from {origin[:100]!r} refused: the "
                               "embedded server answers only pages served from this machine",
                               "ForbiddenError", close=True)
        host = headers.get("host", [None])[0]
        if self.state.check_host and host is not None and not is_loopback(_hostname(host)):
            return error_reply(403, f"Host {host[:100]!r} is not this machine: the server is "
                               "bound to a loopback address", "ForbiddenError", close=True)
        served = scope["path"] in self.paths  # another path is a 404, whatever its method
        state_change = csrf.refusal(scope["method"], scope["path"]) if served else None
        if state_change is not None:
            refused = error_reply(405, state_change, "MethodNotAllowedError")
            return Reply(405, refused.payload, (("allow", ", ".join(csrf.METHODS)),))
        return None

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        """Starlette's routing refusals (404, 405 with Allow) in the server's JSON shape."""
        assert isinstance(exc, HTTPException)
        err_type = {404: "NotFoundError", 405: "MethodNotAllowedError"}.get(exc.status_code,
                                                                           "BadRequestError")
        reply = error_reply(exc.status_code, exc.detail, err_type)
        extra = tuple((exc.headers or {}).items())
        return as_response(Reply(reply.status, reply.payload, extra), self.state)

    def _endpoint(self, route: Route) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Any:
            answer = await self._answer(route, request)  # a streamed one is its own response
            return as_response(answer, self.state) if isinstance(answer, Reply) else answer

        endpoint.__name__ = route.handler
        return endpoint

    async def _answer(self, route: Route, request: Request) -> Reply | EventStream:
        state = self.state
        if route.handler == "health":
            return Reply(200 if state.phase == "ready" else 503)
        if route.json_body and not _is_json(request.headers.get("content-type")):
            return error_reply(415, f"the body must be JSON (Content-Type: application/json), "
                               f"got {request.headers.get('content-type')!r:.100}",
                               "UnsupportedMediaTypeError", close=True)
        if state.phase != "ready":
            return error_reply(503, f"the server is {state.phase}", "ServiceUnavailableError",
                               close=True)
        kind = "model" if route.handler in MODEL_HANDLERS else "light"
        limit = MAX_MODEL_REQUESTS if kind == "model" else MAX_LIGHT_REQUESTS
        if state.admitted[kind] >= limit:
            return error_reply(503, f"the server is busy: {limit} requests are in flight",
                               "ServiceUnavailableError", close=True)
        state.admitted[kind] += 1
        try:
            return await self._run(route, request, kind)
        finally:
            state.admitted[kind] -= 1

    async def _run(self, route: Route, request: Request, kind: str) -> Reply | EventStream:
        try:
            body = await _read_body(request) if route.json_body else b""
        except _BodyTooLarge:
            return _too_large()
        except TimeoutError:
            return error_reply(408, "the request body did not arrive in time",
                               "RequestTimeoutError", close=True)
        except ClientDisconnect:
            request.scope[CANCELLED_KEY] = True
            return Reply(499)  # nobody to send it to
        from dsv4bisect.reference.event_stream import EventStream, stream_requested

        # `"stream": true`: SSE events (SGLang's API only; the PD router answers it with a 400)
        streamed = stream_requested(route.handler, body) if self.state.api_kind == "sglang" \
            else None
        if streamed is not None:
            return EventStream(self, route.handler, streamed, request.method,
                               request.scope["path"])
        gone = threading.Event()  # the client hung up: set from the disconnect watch

        def check() -> bool:
            return self.state.stopping.is_set() or gone.is_set()

        def work() -> Reply | None:
            with self.state.in_thread():
                return self._call(route, body, check, request.method, request.scope["path"])

        limiter = self.model_limiter if kind == "model" else self.light_limiter
        async with anyio.create_task_group() as watch:
            watch.start_soon(watch_disconnect, request.receive, gone)
            try:
                # abandon_on_cancel: a stop that outlasts its grace period does not wait for a
                # thread stuck in the engine (the process exits around it)
                reply = await anyio.to_thread.run_sync(work, limiter=limiter,
                                                       abandon_on_cancel=True)
            finally:
                watch.cancel_scope.cancel()
        if reply is None:
            request.scope[CANCELLED_KEY] = True
            return Reply(499)
        return reply

    def _call(self, route: Route, body: bytes, check: Callable[[], bool], method: str,
              path: str) -> Reply | None:
        """The endpoint logic, on a worker thread; None: cancelled because the client left. The
        log-prob entries it takes are held until it returned (`response_bound.py`)."""
        with response_bound.request_scope():
            return self.guarded(lambda: self._dispatch(route, body), check, method, path)

    def guarded(self, work: Callable[[], T], check: Callable[[], bool], method: str,
                path: str) -> T | Reply | None:
        """`work()` on a worker thread under the request's stop check, every failure an error
        reply (None: cancelled because the client left); a streamed answer opens here too."""
        try:
            with stop_when(check):
                return work()
        except Cancelled:
            if not self.state.stopping.is_set():
                return None
            return error_reply(503, "the server is stopping", "ServiceUnavailableError",
                               close=True)
        except ApiError as exc:
            return error_reply(exc.status, exc.message, exc.err_type)
        except Dsv4BisectError as exc:  # the engine refused the input
            return error_reply(400, exc.message, "BadRequestError")
        except Exception as exc:  # noqa: BLE001 - a bug: log it, never crash or leak a traceback
            log.exception("%s %s failed", method, path)
            return error_reply(500, f"Internal server error: {exc}", "InternalServerError")

    def _dispatch(self, route: Route, body: bytes) -> Reply:
        api = self.state.api
        assert api is not None  # admitted only once ready
        if route.handler == "health_generate":
            return _health_generate(api)
        if route.handler == "flush_cache":  # the prefix cache; a pending hot switch (switch.py)
            return Reply(200, api.flush_cache())
        if route.handler == "model_info":
            return Reply(200, _model_info(api, self.state.checkpoint))
        handler = getattr(api, route.handler)
        if not route.json_body:
            return Reply(200, handler())
        return Reply(200, handler(parse_json(body)))


def _too_large() -> Reply:
    # close: the unread rest of the body would be read as the next request
    return error_reply(413, f"request body over {MAX_BODY_BYTES} bytes", "PayloadTooLargeError",
                       close=True)


class _BodyTooLarge(Exception):
    pass


async def _read_body(request: Request) -> bytes:
    """The whole body, counted as it arrives (a lying Content-Length cannot get past the bound:
    h11 holds the client to it, and this holds h11)."""
    chunks, size = [], 0
    with anyio.fail_after(BODY_TIMEOUT_S):
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _BodyTooLarge
            chunks.append(chunk)
    return b"".join(chunks)


def _health_generate(api: ServerApi) -> Reply:
    try:
        api.health_generate()
    except Cancelled:
        raise
    except Exception:  # noqa: BLE001 - an unhealthy engine is a 503, not a crash
        log.exception("health_generate failed")
        return Reply(503)
    return Reply(200)


def _model_info(api: ServerApi, checkpoint: str | None) -> dict[str, Any]:
    path = api.cfg.server_info.get("model_path") or checkpoint or api.cfg.served_model_name
    return {"model_path": path, "tokenizer_path": "byte-level",
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": "default"}


def _local_origin(origin: str) -> bool:
    try:
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and is_loopback(parts.hostname)
    except ValueError:  # e.g. a bad port or bracket
        return False


def _hostname(host_header: str) -> str | None:
    try:
        return urlsplit("//" + host_header.strip()).hostname
    except ValueError:
        return None


def is_loopback(name: str | None) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (lower-cased, without brackets: urlsplit's hostname)."""
    if name is None:
        return False
    if name.lower() in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False



def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                            and media.endswith("+json"))
