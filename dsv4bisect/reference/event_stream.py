"""The HTTP side of a streamed answer: an ASGI response that sends server-sent events as the
engine makes them (the events themselves: reference/stream_api.py).

One worker thread per stream, as for every model request (`HttpApp.model_limiter`): it checks
the request (a refusal is an ordinary JSON error reply, status and all, as SGLang validates
before its 200), then walks the answer and hands each event to the event loop, which sends it.
A client that hangs up (the ASGI `http.disconnect` message) sets the request's stop check, so
the engine drops the request at its next step (reference/cancel.py) and the log line reads 499;
a server that stops ends the stream with an error event. The stream counts as a model request
in flight until its last event is sent (`MAX_MODEL_REQUESTS`), and its log-prob entries count
against the bound of those in flight until its last event was made (`response_bound.py`).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from starlette.types import Receive, Scope, Send

from dsv4bisect.errors import Dsv4BisectError
from dsv4bisect.reference import response_bound
from dsv4bisect.reference.cancel import Cancelled
from dsv4bisect.reference.http_reply import CANCELLED_KEY, Reply, as_response, watch_disconnect
from dsv4bisect.reference.request_body import ApiError
from dsv4bisect.reference.stream_api import DONE, event, open_stream

if TYPE_CHECKING:
    from dsv4bisect.reference.http_state import ServerState

log = logging.getLogger("dsv4bisect.reference.server")
T = TypeVar("T")

OPENED, END = object(), object()  # the worker's markers: the request was accepted; no more
HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class StreamingApp(Protocol):
    """What a stream uses of `http_app.HttpApp` (which imports this module: not by name)."""

    state: ServerState
    model_limiter: anyio.CapacityLimiter

    def guarded(self, work: Callable[[], T], check: Callable[[], bool], method: str,
                path: str) -> T | Reply | None: ...


class EventStream:
    """The response to a request with `"stream": true` on a route that streams."""

    def __init__(self, app: StreamingApp, handler: str, data: object, method: str, path: str
                 ) -> None:
        self.app, self.handler, self.data = app, handler, data
        self.method, self.path = method, path
        self.gone = threading.Event()  # the client hung up

    def _check(self) -> bool:
        return self.app.state.stopping.is_set() or self.gone.is_set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.app.state
        state.admitted["model"] += 1
        into, out = anyio.create_memory_object_stream[Any](math.inf)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._run_worker, into)
                tasks.start_soon(watch_disconnect, receive, self.gone)
                first = await out.receive()
                if first is not OPENED:  # refused (a JSON error), or the client already left
                    reply = first if isinstance(first, Reply) else Reply(499)
                    if reply.status == 499:
                        scope[CANCELLED_KEY] = True
                    await as_response(reply, state)(scope, receive, send)
                else:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": HEADERS})
                    async for item in out:
                        if item is END:
                            break
                        await send({"type": "http.response.body", "body": item.encode(),
                                    "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    if self.gone.is_set():
                        scope[CANCELLED_KEY] = True
                tasks.cancel_scope.cancel()  # the disconnect watch; the worker has ended
        finally:
            state.admitted["model"] -= 1

    async def _run_worker(self, into: Any) -> None:
        def put(item: object) -> None:
            anyio.from_thread.run_sync(into.send_nowait, item)

        # abandon_on_cancel: a stop that outlasts its grace period does not wait for a thread
        # stuck in the engine (as for an unstreamed request)
        await anyio.to_thread.run_sync(self._work, put, limiter=self.app.model_limiter,
                                       abandon_on_cancel=True)

    def _work(self, put: Any) -> None:
        """On a worker thread: open the stream (or say why not), then walk it."""
        api = self.app.state.api
        assert api is not None  # admitted only once ready
        # the log-prob entries the request takes are held until its last event was made
        with self.app.state.in_thread(), response_bound.request_scope():
            try:
                opened = self.app.guarded(lambda: open_stream(api, self.handler, self.data),
                                          self._check, self.method, self.path)
                if opened is None or not isinstance(opened, Iterator):
                    put(opened)  # an error Reply, or None: the client left
                    return
                put(OPENED)
                self._walk(opened, put)
            finally:
                put(END)

    def _walk(self, events: Iterator[str], put: Any) -> None:
        try:
            for item in events:
                put(item)
        except Cancelled:
            if self.app.state.stopping.is_set():
                put(_error_event(503, "the server is stopping", "ServiceUnavailableError"))
                put(DONE)
        except (ApiError, Dsv4BisectError) as exc:  # the engine refused it mid-answer
            put(_error_event(400, getattr(exc, "message", str(exc)), "BadRequestError"))
            put(DONE)
        except Exception as exc:  # noqa: BLE001 - a bug: log it, end the stream, keep serving
            log.exception("%s %s failed mid-stream", self.method, self.path)
            put(_error_event(500, f"Internal server error: {exc}", "InternalServerError"))
            put(DONE)


def _error_event(status: int, message: str, err_type: str) -> str:
    """An error after the 200 went out: SGLang sends it as one more event, then [DONE]."""
    return event({"object": "error", "message": message, "type": err_type, "param": None,
                  "code": status, "error": {"message": message, "type": err_type,
                                            "code": status}})


def stream_requested(handler: str, body: bytes) -> object | None:
    """The parsed body when a request to `handler` asks for a streamed answer (None: it does
    not, or the body is not plain JSON: the unstreamed path answers that)."""
    from dsv4bisect.reference.request_body import parse_json
    from dsv4bisect.reference.stream_api import ROUTES, wants_stream

    if handler not in ROUTES or b'"stream"' not in body:
        return None
    try:
        data = parse_json(body)
        return data if wants_stream(data) else None
    except ApiError:
        return None
