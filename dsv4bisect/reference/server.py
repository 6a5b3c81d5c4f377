"""The embedded engine's HTTP server: SGLang's API subset on a small stdlib HTTP/1.1 server.

The socket is bound first (a busy port fails at once), then the engine loads while `/health`
answers 503, as SGLang's does while starting. One log line per request goes to the
`dsv4bisect.reference.server` logger. `serve()` blocks until SIGTERM or SIGINT, then stops the
running generation, answers what is queued with 503, joins every thread and returns.

How it holds up as a server (the limits are the constants below, documented in
docs/reference-api.md):
- One poller thread owns every connection that is not being answered. It accepts (listen backlog
  LISTEN_BACKLOG, at most MAX_CONNECTIONS open), reads each request's head and body without
  blocking, and drops a request that does not arrive within its timeout: idle, slow (slowloris)
  or half-open clients hold a file descriptor, never a thread.
- A complete request goes to one of two bounded worker pools: `engine` for the routes that run
  the model (each waits while the scheduler batches it with the others), `light` for the rest, so `/health` and
  `/server_info` answer while generations queue. A pool with MAX_QUEUED requests waiting answers
  503 at once. After its reply a keep-alive connection goes back to the poller.
- While a request runs the model, a check polled between model steps (`reference/cancel.py`)
  looks at the client's socket: a client that hung up has its generation cancelled at the next
  decode step, and no reply is sent; the server stopping cancels it the same way (503).
- Browsers: a request whose `Origin` is not this machine is 403, a body that is not declared
  JSON is 415, so a web page cannot drive the engine (a cross-origin `text/plain` POST needs no
  CORS preflight).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import queue
import re
import select
import selectors
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from dsv4bisect.errors import Dsv4BisectError, EngineError
from dsv4bisect.reference.cancel import Cancelled, stop_when
from dsv4bisect.reference.native_api import ServerApi
from dsv4bisect.reference.request_body import ApiError, parse_json
from dsv4bisect.reference.serving import ServeOptions, build_api

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 20
MAX_HEAD_BYTES = 64 << 10  # request line and headers; more is 431 (a real client sends < 4 KiB)
LISTEN_BACKLOG = 128  # connections the kernel queues before accept (the stdlib default is 5)
MAX_CONNECTIONS = 256  # open at once (under the common 1024-descriptor limit); then see _accept
ENGINE_WORKERS = 64  # threads for model routes: each waits on the scheduler, which batches them
LIGHT_WORKERS = 4  # threads for everything else (health, info, tokenize, errors)
MAX_QUEUED = 64  # complete requests waiting for a worker, per pool; beyond: 503 at once
BODY_TIMEOUT_S = 60.0  # from the end of the headers to the end of the body (64 MiB: 1 MB/s)
IDLE_TIMEOUT_S = 60.0  # a keep-alive connection with no request is closed after this
WRITE_TIMEOUT_S = 30.0  # a client that does not read its reply for this long is dropped
STOP_TIMEOUT_S = 30.0  # how long stop() waits for the threads (a step is milliseconds)
POLL_S = 0.25  # the poller's tick: how late a timeout may fire
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# routes whose handler runs the model (the lock): they get the engine pool
ENGINE_HANDLERS = frozenset({"chat", "completions", "generate", "health_generate"})


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


class ReferenceServer:
    """The listening socket, the poller and worker threads, and the engine behind them."""

    def __init__(self, opts: ServeOptions) -> None:
        self.opts = opts
        self.state = "starting"  # starting | ready | stopping
        self.api: ServerApi | None = None  # set once the engine is loaded
        self.stopping = threading.Event()  # set first thing in stop(): cancels model work
        self.listener = _listen(opts.host, opts.port)
        self._open = 0  # open connections (poller, queues and workers together)
        self._open_lock = threading.Lock()
        self.pools = {"engine": _Pool("engine", ENGINE_WORKERS, self),
                      "light": _Pool("light", LIGHT_WORKERS, self)}
        self.poller = _Poller(self)
        # bound to loopback, every client is on this machine and names it in `Host`; another
        # name there is a browser tricked by DNS rebinding (evil.example resolving to 127.0.0.1)
        self.check_host = _is_loopback(opts.host)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    @property
    def url(self) -> str:
        host = self.opts.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self) -> None:
        for pool in self.pools.values():
            pool.start()
        self.poller.start()

    def load(self) -> ServerApi:
        self.api = build_api(self.opts, port=self.port)
        self.state = "ready"
        return self.api

    def stop(self) -> bool:
        """Cancel model work, close every connection not being answered, answer what is queued
        (503: stopping), join the threads. False if one did not end within STOP_TIMEOUT_S."""
        self.state = "stopping"
        self.stopping.set()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        self.poller.stop(deadline)
        for pool in self.pools.values():
            pool.stop()
        joined = all([pool.join(deadline) for pool in self.pools.values()])
        return joined and not self.poller.thread.is_alive()

    # ---- connection bookkeeping (called from the poller and the workers) ----------------------

    def opened(self) -> bool:
        with self._open_lock:
            if self._open >= MAX_CONNECTIONS:
                return False
            self._open += 1
            return True

    def close(self, conn: _Conn) -> None:
        with self._open_lock:
            if conn.closed:
                return
            conn.closed = True
            self._open -= 1
        conn.sock.close()

    # ---- requests -------------------------------------------------------------------------------

    def handle(self, method: str, path: str, body: bytes,
               headers: Mapping[str, str] | None = None) -> Reply:
        headers = headers or {}
        origin = headers.get("Origin")
        if origin is not None and not _local_origin(origin):
            return error_reply(403, f"cross-origin request from {origin[:100]!r} refused: the "
                               "embedded server answers only pages served from this machine",
                               "ForbiddenError")
        host = headers.get("Host")
        if self.check_host and host is not None and not _is_loopback(_hostname(host)):
            return error_reply(403, f"Host {host[:100]!r} is not this machine: the server is "
                               "bound to a loopback address", "ForbiddenError")
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
        if route.json_body and not _is_json(headers.get("Content-Type")):
            return error_reply(415, f"the body must be JSON (Content-Type: application/json), "
                               f"got {str(headers.get('Content-Type'))[:100]!r}",
                               "UnsupportedMediaTypeError")
        api = self.api
        if self.state != "ready" or api is None:
            return error_reply(503, f"the server is {self.state}", "ServiceUnavailableError")
        if route.handler == "health_generate":
            return self._health_generate(api)
        if route.handler == "flush_cache":  # the prefix cache; a pending hot switch (switch.py)
            return Reply(200, api.flush_cache())
        if route.handler == "model_info":
            return Reply(200, self._model_info(api))
        handler = getattr(api, route.handler)
        if not route.json_body:
            return Reply(200, handler())
        return Reply(200, handler(parse_json(body)))

    @staticmethod
    def _health_generate(api: ServerApi) -> Reply:
        try:
            api.health_generate()
        except Cancelled:
            raise
        except Exception:  # noqa: BLE001 - an unhealthy engine is a 503, not a crash
            log.exception("health_generate failed")
            return Reply(503)
        return Reply(200)

    def _model_info(self, api: ServerApi) -> dict[str, Any]:
        name = api.cfg.served_model_name
        return {"model_path": self.opts.checkpoint or name, "tokenizer_path": "byte-level",
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": "default"}


def _listen(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
        sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    except socket.gaierror as exc:
        raise EngineError(f"cannot bind {host}:{port}: {exc.strerror}", "check --host") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise EngineError(f"port {host}:{port} is already in use",
                              "choose another --port or stop the process holding it") from None
        raise EngineError(f"cannot bind {host}:{port}: {exc.strerror}",
                          "check --host and --port") from None
    sock.setblocking(False)
    return sock


def _local_origin(origin: str) -> bool:
    try:
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and _is_loopback(parts.hostname)
    except ValueError:  # e.g. a bad port or bracket
        return False


def _hostname(host_header: str) -> str | None:
    try:
        return urlsplit("//" + host_header.strip()).hostname
    except ValueError:
        return None


def _is_loopback(name: str | None) -> bool:
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


# ---- connections ---------------------------------------------------------------------------------

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length[ \t]*:[ \t]*(\d{1,19})[ \t]*\r?$")
_CHUNKED = re.compile(rb"(?im)^transfer-encoding[ \t]*:")
_EXPECT_CONTINUE = re.compile(rb"(?im)^expect[ \t]*:[ \t]*100-continue[ \t]*\r?$")


class _Conn:
    """One client connection and what has been read from it and not yet consumed."""

    def __init__(self, sock: socket.socket, addr: Any) -> None:
        self.sock, self.addr = sock, addr
        self.buf = bytearray()
        self.phase = "idle"  # idle (between requests) | head | body
        self.since = time.monotonic()  # start of the phase
        self.head_end = 0
        self.scanned = 0  # `buf` has no blank line before this (a head trickled in is O(n))
        self.continued = False  # the poller sent this request's `100 Continue`
        self.closed = False  # counted out of the server's open connections

    def reset(self) -> None:
        """Back from a worker: wait for the next request (maybe already in `buf`)."""
        self.phase, self.since, self.head_end = ("head" if self.buf else "idle",
                                                 time.monotonic(), 0)
        self.scanned, self.continued = 0, False

    def timeout(self, header_timeout: float) -> float:
        return {"idle": IDLE_TIMEOUT_S, "head": header_timeout, "body": BODY_TIMEOUT_S}[self.phase]

    def complete(self) -> bool | None:
        """True: the request (head and body) is buffered, or it has a body the worker refuses
        unread (chunked, too large, unclear length); None: the head is over MAX_HEAD_BYTES."""
        if self.phase == "head":
            match = _HEAD_END.search(self.buf, self.scanned, MAX_HEAD_BYTES + 4)
            if match is None:
                self.scanned = max(0, len(self.buf) - 3)  # a blank line may straddle reads
                return None if len(self.buf) > MAX_HEAD_BYTES else False
            self.phase, self.since, self.head_end = "body", time.monotonic(), match.end()
        head = bytes(self.buf[: self.head_end])
        lengths = _CONTENT_LENGTH.findall(head)
        if _CHUNKED.search(head) or len(lengths) != 1:  # no body, or one the worker refuses
            return True
        need = int(lengths[0])
        if need > MAX_BODY_BYTES:
            return True
        if len(self.buf) - self.head_end >= need:
            return True
        if not self.continued and _EXPECT_CONTINUE.search(head):
            # the client waits for this before it sends the body; sent here, the body is read
            # here too, and no worker waits on a client that may never send it
            self.continued = True
            try:
                self.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            except OSError:
                pass
        return False

    def route(self) -> Route | None:
        line = bytes(self.buf[: self.buf.find(b"\n")]).split()
        if len(line) < 2:
            return None
        try:
            return ROUTES.get(urlsplit(line[1].decode("latin-1")).path)
        except ValueError:
            return None


def _refuse(sock: socket.socket, status: int, message: str) -> None:
    """Best-effort error reply on a non-blocking socket the caller then closes."""
    reply = error_reply(status, message, "ServiceUnavailableError" if status == 503
                        else "RequestTimeoutError" if status == 408 else "BadRequestError")
    data = json.dumps(reply.payload, separators=(",", ":")).encode()
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    try:
        sock.send(head + data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}


class _Poller:
    """The thread that accepts and reads; hands complete requests to the pools."""

    def __init__(self, server: ReferenceServer) -> None:
        self.server = server
        self.sel = selectors.DefaultSelector()
        self.conns: set[_Conn] = set()  # registered with `sel`
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a worker never blocks on waking the poller
        self._returned: deque[_Conn] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="http-poller", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, deadline: float) -> None:
        self._stop.set()
        self._wake()
        if self.thread.is_alive():
            self.thread.join(max(0.0, deadline - time.monotonic()))
        else:
            self._close_all()

    def give_back(self, conn: _Conn) -> None:
        """From a worker: the connection stays open for its next request."""
        with self._lock:
            if not self._closed:
                self._returned.append(conn)
                self._wake()
                return
        self.server.close(conn)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # the pipe is full: a wake-up is pending anyway
            pass

    def _run(self) -> None:
        self.sel.register(self.server.listener, selectors.EVENT_READ, "listen")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                for key, _ in self.sel.select(POLL_S):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._take_returned()
                    elif key.data in self.conns:  # not dropped earlier in this batch
                        self._read(key.data)
                self._expire()
        except Exception:  # noqa: BLE001 - a bug; without the poller nothing is served
            log.exception("the HTTP poller failed")
        finally:
            self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            self._closed = True
            returned, self._returned = list(self._returned), deque()
        for conn in [*self.conns, *returned]:
            self._drop(conn)
        self.server.listener.close()
        self.sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def _accept(self) -> None:
        for _ in range(LISTEN_BACKLOG):
            try:
                sock, addr = self.server.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: leave the rest in the backlog
                log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            if not self.server.opened() and not self._evict_idle():
                _refuse(sock, 503, f"the server has {MAX_CONNECTIONS} connections open")
                sock.close()
                continue
            self._watch(_Conn(sock, addr))

    def _evict_idle(self) -> bool:
        """At the connection cap, a new client beats the longest-idle one (a connection that
        has sent nothing, or a keep-alive one between requests), so idle sockets cannot lock
        everyone out for IDLE_TIMEOUT_S."""
        idle = [c for c in self.conns if c.phase == "idle"]
        if not idle:
            return False
        self._drop(min(idle, key=lambda c: c.since))
        return self.server.opened()

    def _watch(self, conn: _Conn) -> None:
        conn.sock.setblocking(False)
        self.conns.add(conn)
        self.sel.register(conn.sock, selectors.EVENT_READ, conn)
        if conn.buf:
            self._advance(conn)

    def _take_returned(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            with self._lock:
                if not self._returned:
                    return
                conn = self._returned.popleft()
            conn.reset()
            self._watch(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        if conn.phase == "idle":
            conn.phase, conn.since = "head", time.monotonic()
        conn.buf += data
        self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        done = conn.complete()
        if done is None:
            self._drop(conn, 431, f"request head over {MAX_HEAD_BYTES} bytes")
        elif done:
            self._unwatch(conn)
            route = conn.route()
            pool = self.server.pools["engine" if route is not None
                                     and route.handler in ENGINE_HANDLERS else "light"]
            if not pool.submit(conn):
                _refuse(conn.sock, 503, f"the server is busy: {MAX_QUEUED} requests are waiting")
                self.server.close(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self.conns
                     if now - c.since > c.timeout(self.server.opts.header_timeout)]:
            if conn.phase == "idle":
                self._drop(conn)  # an idle keep-alive connection: close quietly
            else:
                log.info("dropped %s: its request did not arrive within %.0f s (%s)",
                         conn.addr[0], conn.timeout(self.server.opts.header_timeout), conn.phase)
                self._drop(conn, 408, f"the request {conn.phase} did not arrive in time")

    def _unwatch(self, conn: _Conn) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            self.sel.unregister(conn.sock)

    def _drop(self, conn: _Conn, status: int | None = None, message: str = "") -> None:
        self._unwatch(conn)
        if status is not None:
            _refuse(conn.sock, status, message)
        self.server.close(conn)


class _Pool:
    """Worker threads that answer complete requests, one connection at a time each."""

    def __init__(self, name: str, size: int, server: ReferenceServer) -> None:
        self.server = server
        self.queue: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._work, name=f"http-{name}-{i}", daemon=True)
                        for i in range(size)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def submit(self, conn: _Conn) -> bool:
        # only the poller submits, and workers only take: qsize() cannot grow behind our back
        if self.queue.qsize() >= MAX_QUEUED:
            return False
        self.queue.put(conn)
        return True

    def stop(self) -> None:
        for _ in self.threads:
            self.queue.put(None)  # after what is queued: that is answered first (503)

    def join(self, deadline: float) -> bool:
        for t in self.threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def _work(self) -> None:
        while (conn := self.queue.get()) is not None:
            keep = False
            try:
                handler = _Handler(conn, self.server)
                handler.handle_one_request()
                keep = not handler.close_connection and not self.server.stopping.is_set()
            except OSError as exc:  # the client reset the connection or stopped reading
                log.debug("%s: %s", conn.addr[0], exc)
            except Exception:  # noqa: BLE001 - a bug; the connection is closed, the server lives
                log.exception("request from %s failed", conn.addr[0])
            if keep:
                self.server.poller.give_back(conn)
            else:
                self.server.close(conn)


def _client_gone(sock: socket.socket) -> bool:
    """Whether the peer closed or reset the connection (polled between model steps: cheap, and
    a pipelined next request in the buffer does not count)."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI)
        events = poller.poll(0)
    except (OSError, ValueError):  # closed under us
        return True
    if not events:
        return False
    if events[0][1] & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
        return True
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


class _Reader:
    """The handler's rfile: the bytes the poller buffered, then blocking reads that all end by
    one deadline (a per-recv timeout alone lets a client trickle bytes forever)."""

    def __init__(self, conn: _Conn, deadline: float) -> None:
        self.conn, self.deadline = conn, deadline

    def _fill(self) -> bool:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.conn.sock.settimeout(left)
        data = self.conn.sock.recv(1 << 16)
        self.conn.buf += data
        return bool(data)

    def readline(self, limit: int = -1) -> bytes:
        buf = self.conn.buf
        while True:
            end = buf.find(b"\n")
            if end >= 0 and (limit < 0 or end < limit):
                return self._take(end + 1)
            if 0 <= limit <= len(buf) or not self._fill():
                return self._take(len(buf) if limit < 0 else min(limit, len(buf)))

    def read(self, n: int) -> bytes:
        while len(self.conn.buf) < n and self._fill():
            pass
        return self._take(min(n, len(self.conn.buf)))

    def _take(self, n: int) -> bytes:
        out = bytes(self.conn.buf[:n])
        del self.conn.buf[:n]
        return out

    def close(self) -> None:
        pass


class _Writer:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def write(self, data: bytes) -> int:
        self.sock.settimeout(WRITE_TIMEOUT_S)
        self.sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Handler(BaseHTTPRequestHandler):
    """One request on a connection whose head the poller has read. Not the stdlib's
    setup/handle/finish cycle: the worker calls `handle_one_request` and then decides whether
    the connection goes back to the poller."""

    protocol_version = "HTTP/1.1"  # keep-alive: every reply carries Content-Length
    server_version = "dsv4bisect-reference"

    def __init__(self, conn: _Conn, app: ReferenceServer) -> None:  # noqa: D107
        self.conn, self.app = conn, app
        self.server = app  # type: ignore[assignment]
        self.request = self.connection = conn.sock
        self.client_address = conn.addr
        self.rfile = _Reader(conn, time.monotonic() + BODY_TIMEOUT_S)  # type: ignore[assignment]
        self.wfile = _Writer(conn.sock)  # type: ignore[assignment]
        self.close_connection = True

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
        ms = (time.perf_counter() - tic) * 1e3
        if reply is None:
            self.close_connection = True
            log.info("%s %s 499 %.1fms (client disconnected: generation cancelled)", method,
                     path, ms)
            return
        self._send(reply)
        log.info("%s %s %d %.1fms", method, path, reply.status, ms)

    def _should_stop(self) -> bool:
        return self.app.stopping.is_set() or _client_gone(self.connection)

    def _reply(self, method: str, path: str) -> Reply | None:
        app = self.app
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            return error_reply(411, "send the body with Content-Length (chunked request bodies "
                               "are not supported)", "LengthRequiredError")
        for name in ("Origin", "Content-Type"):  # the checks in handle() read the first one
            if len(self.headers.get_all(name) or []) > 1:
                self.close_connection = True
                return error_reply(400, f"more than one {name} header", "BadRequestError")
        lengths = {v.strip() for v in self.headers.get_all("Content-Length") or []}
        if len(lengths) > 1 or any(not re.fullmatch(r"[0-9]{1,19}", v) for v in lengths):
            self.close_connection = True  # where the body ends is unknown: so is the next request
            return error_reply(400, "bad Content-Length header", "BadRequestError")
        length = int(lengths.pop()) if lengths else 0
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the unread body would corrupt the next request
            return error_reply(413, f"request body over {MAX_BODY_BYTES} bytes",
                               "PayloadTooLargeError")
        try:
            body = self.rfile.read(length) if length else b""
        except TimeoutError:
            self.close_connection = True
            return error_reply(408, "the request body did not arrive in time",
                               "RequestTimeoutError")
        if len(body) < length:
            self.close_connection = True
            return None  # the client hung up mid-body
        try:
            with stop_when(self._should_stop):
                return app.handle(method, path, body, self.headers)
        except Cancelled:
            if not app.stopping.is_set():
                return None
            self.close_connection = True
            return error_reply(503, "the server is stopping", "ServiceUnavailableError")
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
            text = json.dumps(reply.payload, ensure_ascii=False, allow_nan=False,
                              separators=(",", ":"))
            try:
                data = text.encode()
            except UnicodeEncodeError:  # a lone surrogate got through: escape it, stay JSON
                data = json.dumps(reply.payload, allow_nan=False, separators=(",", ":")).encode()
            ctype = "application/json"
        self.send_response(reply.status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for key, value in reply.headers:
            self.send_header(key, value)
        if self.close_connection or self.app.stopping.is_set():
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def handle_expect_100(self) -> bool:
        if not self.conn.continued:  # normally the poller already said it
            return super().handle_expect_100()
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None
                   ) -> None:
        """The stdlib's own refusals (bad request line, too many headers, unknown method ...)
        in the server's JSON error shape instead of an HTML page."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # a line parse_request gave up on: no HTTP/0.9
            self.request_version = self.protocol_version  # here, so the reply has a status line
        text = message or HTTPStatus(code).phrase
        log.info("%s %d (%s)", self.requestline[:100] or "-", code, text)
        self._send(error_reply(code, text, "NotImplementedError" if code == 501
                               else "BadRequestError"))

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
        if server is not None and not server.stop():
            # a thread still inside the model: letting the interpreter finalise around it is
            # what aborted with "terminate called without an active exception"
            log.error("a request thread did not stop within %.0f s; exiting without it",
                      STOP_TIMEOUT_S)
            sys.stderr.flush()
            os._exit(0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
