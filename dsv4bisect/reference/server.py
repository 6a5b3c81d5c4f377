"""The embedded engine's HTTP server: SGLang's API subset on a stdlib `ThreadingHTTPServer`.

The socket is bound first (a busy port fails at once), then the engine loads while `/health`
answers 503, as SGLang's does while starting. Model work is serialized by the generator's lock;
`/health` never takes it. One log line per request goes to the `dsv4bisect.reference.server`
logger. `serve()` blocks until SIGTERM or SIGINT and then shuts down cleanly.
"""

from __future__ import annotations

import errno
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from dsv4bisect.errors import Dsv4BisectError, EngineError
from dsv4bisect.reference.native_api import ServerApi
from dsv4bisect.reference.request_body import ApiError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 20
FLUSH_TEXT = ("Cache flushed. The embedded engine keeps no KV cache across requests, so there was "
              "nothing to flush.\n")


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 30000
    checkpoint: str | None = None  # a checkpoint directory; None: the random tiny model
    device: str = "auto"
    chunk_size: int = 2048
    moe_backend: str = "triton"
    threads: int | None = None
    max_model_len: int | None = None
    served_model_name: str | None = None
    patches: Mapping[str, str] = field(default_factory=dict)  # name -> variant


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
    "/flush_cache": Route(("GET", "POST"), "flush_cache"),
    "/v1/chat/completions": Route(("POST",), "chat", json_body=True),
    "/v1/completions": Route(("POST",), "completions", json_body=True),
    "/generate": Route(("POST", "PUT"), "generate", json_body=True),
    "/tokenize": Route(("POST",), "tokenize", json_body=True),
    "/v1/tokenize": Route(("POST",), "tokenize", json_body=True),
}


@dataclass(frozen=True)
class Reply:
    status: int
    payload: Any = None  # JSON value, str (text/plain) or None (empty body)
    headers: tuple[tuple[str, str], ...] = ()


def error_reply(status: int, message: str, err_type: str) -> Reply:
    """SGLang's flat ErrorResponse, plus the `error` envelope its `/generate` and newer
    OpenAI routes use, so clients of either shape find the message."""
    return Reply(status, {"object": "error", "message": message, "type": err_type, "param": None,
                          "code": status,
                          "error": {"message": message, "type": err_type, "code": status}})


def build_api(opts: ServeOptions, *, port: int) -> ServerApi:
    """Load the engine (this imports torch) and wrap it in the endpoint handlers."""
    from dsv4bisect import __version__
    from dsv4bisect.reference.api import ApiConfig
    from dsv4bisect.reference.engine import ReferenceEngine
    from dsv4bisect.reference.generation import Generator
    from dsv4bisect.reference.tokenizer import ByteTokenizer

    extra = {} if opts.max_model_len is None else {"max_model_len": opts.max_model_len}
    engine = ReferenceEngine.load(
        opts.checkpoint, patches=dict(opts.patches), moe_backend=opts.moe_backend,
        chunk_size=opts.chunk_size, device=opts.device, threads=opts.threads, **extra,
    )
    name = opts.served_model_name or opts.checkpoint or "reference-tiny-random"
    info = dict(engine.info())
    ratios = info.get("compress_ratios") or (info.get("config") or {}).get("compress_ratios")
    info |= {
        "engine": "dsv4bisect-reference", "version": __version__,
        "served_model_name": name, "max_model_len": engine.max_model_len,
        "compress_ratios": ratios, "moe_backend": opts.moe_backend,
        "chunk_size": opts.chunk_size, "patches": info.get("patches", dict(opts.patches)),
        # SGLang's ServerArgs names for the same settings, for clients that read those
        "model_path": opts.checkpoint or name, "context_length": engine.max_model_len,
        "chunked_prefill_size": opts.chunk_size, "moe_runner_backend": opts.moe_backend,
        "host": opts.host, "port": port,
    }
    generator = Generator(engine, ByteTokenizer(engine.config.vocab_size))
    return ServerApi(generator, ApiConfig(name, engine.max_model_len, info))


class ReferenceServer:
    """The bound socket, the serving thread and the engine behind them."""

    def __init__(self, opts: ServeOptions) -> None:
        self.opts = opts
        self.state = "starting"  # starting | ready | stopping
        self.api: ServerApi | None = None  # set once the engine is loaded
        try:
            self.httpd = ThreadingHTTPServer((opts.host, opts.port), _Handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise EngineError(f"port {opts.host}:{opts.port} is already in use",
                                  "choose another --port or stop the process holding it") from None
            raise EngineError(f"cannot bind {opts.host}:{opts.port}: {exc.strerror}",
                              "check --host and --port") from None
        self.httpd.daemon_threads = True
        self.httpd.app = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.opts.host}:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def load(self) -> ServerApi:
        self.api = build_api(self.opts, port=self.port)
        self.state = "ready"
        return self.api

    def stop(self) -> None:
        self.state = "stopping"
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()

    def handle(self, method: str, path: str, body: bytes) -> Reply:
        route = ROUTES.get(path)
        if route is None:
            return error_reply(404, "Not Found", "NotFoundError")
        if method == "HEAD" and "GET" in route.methods:
            method = "GET"  # same reply; the handler leaves the body out
        if method not in route.methods:
            reply = error_reply(405, "Method Not Allowed", "MethodNotAllowedError")
            return Reply(reply.status, reply.payload, (("Allow", ", ".join(route.methods)),))
        if route.handler == "health":
            return Reply(200 if self.state == "ready" else 503)
        api = self.api
        if self.state != "ready" or api is None:
            return error_reply(503, f"the server is {self.state}", "ServiceUnavailableError")
        if route.handler == "health_generate":
            return self._health_generate(api)
        if route.handler == "flush_cache":
            return Reply(200, FLUSH_TEXT)
        if route.handler == "model_info":
            return Reply(200, self._model_info(api))
        handler = getattr(api, route.handler)
        if not route.json_body:
            return Reply(200, handler())
        try:
            data = json.loads(body) if body.strip() else None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return error_reply(400, f"malformed JSON body: {exc}", "BadRequestError")
        if data is None:
            return error_reply(400, "the request needs a JSON body", "BadRequestError")
        return Reply(200, handler(data))

    @staticmethod
    def _health_generate(api: ServerApi) -> Reply:
        try:
            api.health_generate()
        except Exception:  # noqa: BLE001 - an unhealthy engine is a 503, not a crash
            log.exception("health_generate failed")
            return Reply(503)
        return Reply(200)

    def _model_info(self, api: ServerApi) -> dict[str, Any]:
        name = api.cfg.served_model_name
        return {"model_path": self.opts.checkpoint or name, "tokenizer_path": "byte-level",
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": "default"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: every reply carries Content-Length
    server_version = "dsv4bisect-reference"

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    def _dispatch(self, method: str) -> None:
        tic = time.perf_counter()
        path = urlsplit(self.path).path
        reply = self._reply(method, path)
        self._send(reply)
        log.info("%s %s %d %.1fms", method, path, reply.status,
                 (time.perf_counter() - tic) * 1e3)

    def _reply(self, method: str, path: str) -> Reply:
        app: ReferenceServer = self.server.app  # type: ignore[attr-defined]
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            return error_reply(400, "bad Content-Length header", "BadRequestError")
        if length > MAX_BODY_BYTES or length < 0:
            self.close_connection = True  # the unread body would corrupt the next request
            return error_reply(413, f"request body over {MAX_BODY_BYTES} bytes",
                               "PayloadTooLargeError")
        body = self.rfile.read(length) if length else b""
        try:
            return app.handle(method, path, body)
        except ApiError as exc:
            return error_reply(exc.status, exc.message, exc.err_type)
        except Dsv4BisectError as exc:  # the engine refused the input
            return error_reply(400, exc.message, "BadRequestError")
        except Exception as exc:  # noqa: BLE001 - a bug: log it, never crash or leak a traceback
            log.exception("%s %s failed", method, path)
            return error_reply(500, f"Internal server error: {exc}", "InternalServerError")

    def _send(self, reply: Reply) -> None:
        if reply.payload is None:
            data, ctype = b"", "text/plain; charset=utf-8"
        elif isinstance(reply.payload, str):
            data, ctype = reply.payload.encode(), "text/plain; charset=utf-8"
        else:
            data = json.dumps(reply.payload, ensure_ascii=False, allow_nan=False,
                              separators=(",", ":")).encode()
            ctype = "application/json"
        self.send_response(reply.status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for key, value in reply.headers:
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug(format, *args)  # requests are logged once, by _dispatch

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        log.warning(format, *args)


class _Stop(BaseException):
    """Raised by the signal handler to unwind the main thread (also out of engine loading)."""


def _on_signal(signum: int, frame: object) -> None:
    raise _Stop(signum)


def serve(opts: ServeOptions, on_ready: Callable[[str, dict[str, Any]], None]) -> None:
    """Bind, load the engine, call `on_ready(url, server_info)`, serve until SIGTERM/SIGINT."""
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    server: ReferenceServer | None = None
    try:
        server = ReferenceServer(opts)
        server.start()
        api = server.load()
        on_ready(server.url, api.server_info())
        while True:
            time.sleep(3600)
    except _Stop as stop:
        log.info("received %s; shutting down", signal.Signals(stop.args[0]).name)
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        if server is not None:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
