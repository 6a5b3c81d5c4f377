"""`dsv4bisect serve`'s process: the embedded engine behind SGLang's API, on uvicorn.

As SGLang's `http_server.py` runs its FastAPI app on uvicorn, this runs `http_app.HttpApp` (a
Starlette app) on uvicorn, with a head deadline added to uvicorn's h11 protocol
(`http_protocol.py`). The process:

1. The socket is bound first (a busy port fails at once, `--port 0` learns its port).
2. The engine loads on a thread while uvicorn already serves: `/health` answers 503, as
   SGLang's does while starting. Once loaded, `on_ready(url, server_info)` is called (the CLI
   prints its `ready:` line).
3. SIGTERM or SIGINT in any phase (`stop_signal.py`: a pipe and a watcher thread, whatever the
   main thread is doing) stops it: new requests get 503, running generations are cancelled at
   their next model step (503), uvicorn closes its connections, the request threads are
   joined, then `serve` returns (the CLI then ends the process with exit 0, skipping
   interpreter finalisation: `cli/serve.py`). Stopped while the engine is still
   loading, or with a thread that does not end in time (stuck in torch), the process leaves by
   `os._exit(0)` after saying so on stderr; the watcher's hard deadline guarantees that within
   `stop_signal.HARD_EXIT_S` of the signal whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from dsv4bisect.errors import EngineError
from dsv4bisect.reference.http_app import (
    MAX_BODY_BYTES,
    MAX_MODEL_REQUESTS,
    ROUTES,
    HttpApp,
    Reply,
    Route,
    ServerState,
    error_reply,
    is_loopback,
)
from dsv4bisect.reference.http_protocol import protocol_with_header_timeout
from dsv4bisect.reference.native_api import ServerApi
from dsv4bisect.reference.serving import ServeOptions, build_api
from dsv4bisect.reference.stop_signal import StopSignal, exit_now

__all__ = ["MAX_BODY_BYTES", "MAX_HEAD_BYTES", "MAX_MODEL_REQUESTS", "ROUTES", "ReferenceServer",
           "Reply", "Route", "ServeOptions", "error_reply", "serve"]

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 << 10  # request line and headers; more is 431 (a real client sends < 4 KiB)
LISTEN_BACKLOG = 128  # connections the kernel queues before accept
IDLE_TIMEOUT_S = 60  # a keep-alive connection with no request is closed after this
# from the signal: requests still running after this are abandoned (and one more second for
# their threads); below the watcher's HARD_EXIT_S, which catches everything else
STOP_GRACE_S = 5.0
SERVER_HEADER = "dsv4bisect-reference"
FD_LIMIT = 65536  # open descriptors asked for (soft limit), if the hard limit allows


class _Uvicorn(uvicorn.Server):
    """uvicorn's server without its own signal handling: `StopSignal` owns SIGTERM/SIGINT
    (uvicorn's re-raises the signal after shutdown, which would end the process with -15)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ReferenceServer:
    """The listening socket, the engine load and uvicorn, and how they stop."""

    def __init__(self, opts: ServeOptions,
                 loader: Callable[..., Any] = build_api) -> None:
        self.opts, self.loader_fn = opts, loader
        self.listener = _listen(opts.host, opts.port)
        self.state = ServerState(check_host=is_loopback(opts.host), checkpoint=opts.checkpoint,
                                 api_kind=opts.api)
        self.load_error: BaseException | None = None
        self.loader: threading.Thread | None = None
        self.stop_requested_at: float | None = None
        self._api: ServerApi | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loaded: asyncio.Event | None = None
        self._uvicorn: _Uvicorn | None = None

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    @property
    def url(self) -> str:
        host = self.opts.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def request_stop(self, signum: int) -> None:
        """From any thread: cancel model work now, then have uvicorn shut down."""
        log.info("received %s; shutting down", signal.Signals(signum).name)
        self.stop_requested_at = time.monotonic()
        self.state.stopping.set()  # new requests 503, running generations stop at their next step
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._exit_uvicorn)
            except RuntimeError:  # the loop has closed: serving is over already
                pass

    def run(self, on_ready: Callable[[str, dict[str, Any]], None]) -> None:
        """Serve until a stop request (or a failed load); blocks the calling thread."""
        asyncio.run(self._main(on_ready))

    def threads_done(self, deadline: float) -> bool:
        """Whether every request thread left the engine by `deadline` (monotonic)."""
        return self.state.wait_threads(deadline)

    def _exit_uvicorn(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    async def _main(self, on_ready: Callable[[str, dict[str, Any]], None]) -> None:
        self._loaded = asyncio.Event()
        config = uvicorn.Config(
            HttpApp(self.state), http=protocol_with_header_timeout(self.opts.header_timeout),
            lifespan="off", log_config=None, access_log=False, proxy_headers=False,
            server_header=False, headers=[("server", SERVER_HEADER)],
            timeout_keep_alive=IDLE_TIMEOUT_S, timeout_graceful_shutdown=int(STOP_GRACE_S),
            h11_max_incomplete_event_size=MAX_HEAD_BYTES, backlog=LISTEN_BACKLOG,
        )
        self._uvicorn = _Uvicorn(config)
        self._loop = asyncio.get_running_loop()
        if self.state.stopping.is_set():  # a signal during start-up: nothing to load
            self._exit_uvicorn()
        else:
            self.loader = threading.Thread(target=self._load, name="engine-load", daemon=True)
            self.loader.start()
        serving = asyncio.create_task(self._uvicorn.serve(sockets=[self.listener]))
        loaded = asyncio.create_task(self._loaded.wait())
        await asyncio.wait({serving, loaded}, return_when=asyncio.FIRST_COMPLETED)
        if not loaded.done():
            loaded.cancel()
        elif self.load_error is not None:
            self._exit_uvicorn()
        elif not self.state.stopping.is_set():
            while not self._uvicorn.started and not serving.done():
                await asyncio.sleep(0.01)  # accepting before the ready line goes out
            assert self._api is not None
            self.state.api = self._api
            on_ready(self.url, self._api.server_info())
        await serving

    def _load(self) -> None:
        """On the engine-load thread: build the engine (imports torch; seconds to minutes)."""
        try:
            self._api = self.loader_fn(self.opts, port=self.port)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
            self.load_error = exc
        loop, loaded = self._loop, self._loaded
        if loop is not None and loaded is not None:
            try:
                loop.call_soon_threadsafe(loaded.set)
            except RuntimeError:  # stopped while loading: nobody waits any more
                pass


def serve(opts: ServeOptions, on_ready: Callable[[str, dict[str, Any]], None],
          stop_signal: StopSignal | None = None,
          loader: Callable[..., Any] = build_api) -> None:
    """Bind, load the engine, call `on_ready(url, server_info)`, serve until SIGTERM/SIGINT.

    `stop_signal`: one installed earlier (the CLI installs it before its imports, so a signal
    sent right after start-up is not lost); by default installed here, from the main thread.
    `loader(opts, port=)`: what answers the routes (the engine's API; the PD router's,
    reference/pd/router.py).
    """
    signals = stop_signal or StopSignal.install()
    try:
        _raise_fd_limit()
        server = ReferenceServer(opts, loader)
        signals.on_stop(server.request_stop)
        server.run(on_ready)
        if server.stop_requested_at is None:
            if server.load_error is not None:
                raise server.load_error
            return
        _finish_stop(server)
    finally:
        signals.close()


def _finish_stop(server: ReferenceServer) -> None:
    """After uvicorn has shut down: join the request threads, or leave without them."""
    assert server.stop_requested_at is not None
    deadline = server.stop_requested_at + STOP_GRACE_S + 1.0
    if server.loader is not None and server.loader.is_alive():
        # torch cannot be interrupted mid-load, and interpreter finalisation around a thread
        # inside it is what aborted with "terminate called without an active exception"
        log.warning("stopped while the engine was loading; exiting without waiting for it")
        exit_now()
    if not server.threads_done(deadline):
        log.error("a request thread did not stop within %.0f s; exiting without it",
                  deadline - server.stop_requested_at)
        exit_now()
    log.info("stopped")


def _raise_fd_limit() -> None:
    """Idle connections cost a descriptor each: allow as many as the hard limit does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_LIMIT if hard == resource.RLIM_INFINITY else min(hard, FD_LIMIT)
    if soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


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

