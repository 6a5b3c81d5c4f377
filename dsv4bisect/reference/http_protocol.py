"""uvicorn's h11 protocol with the two things this server needs that it lacks.

- A deadline for a request's head. uvicorn closes an idle keep-alive connection after
  `timeout_keep_alive`, but once a client has sent one byte of a request it waits for the rest
  forever: a client trickling its headers (slowloris) or a half-open one holds the connection
  open. Here the head must be complete within `header_timeout` of its first byte (408, close).
  A fresh connection that sends nothing is closed after the keep-alive timeout, as an idle
  keep-alive one is.
- Its refusals in the server's JSON error shape: uvicorn answers a request h11 cannot parse
  with a text/plain 400 whatever h11's reason; here the status is h11's own hint (431 for a
  head over the size bound, 501 for a transfer coding it does not implement, else 400) and the
  body the JSON error every other answer uses.
Connections waiting for their head are the event loop's sockets, not threads: they cost a file
descriptor each until their deadline.
"""

from __future__ import annotations

import asyncio
import json
import logging
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from dsv4bisect.reference.http_app import error_reply

log = logging.getLogger("dsv4bisect.reference.server")

_ERROR_TYPES = {408: "RequestTimeoutError", 431: "BadRequestError", 501: "NotImplementedError"}


class _RecordingConnection(h11.Connection):
    """h11's connection, keeping the last parse error for the refusal uvicorn sends."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise


class HeadDeadlineProtocol(H11Protocol):
    header_timeout: float = 10.0  # set per server by `protocol_with_header_timeout`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = self.config.h11_max_incomplete_event_size
        self.conn = (_RecordingConnection(h11.SERVER, size) if size is not None
                     else _RecordingConnection(h11.SERVER))
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn arms its idle timer only after a reply; a connection that never sends a
        # byte gets the same one
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm()  # these bytes start a request head (or continue one)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the head is complete

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # a pipelined next request may already be partly buffered
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm()

    def send_400_response(self, msg: str) -> None:
        exc = self.conn.last_error
        status = exc.error_status_hint if exc is not None else 400
        text = str(exc) if exc is not None and str(exc) else msg
        log.info("refused a request from %s: %d (%s)", _peer(self.client), status, text)
        self._refuse(status, text)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        log.info("dropped %s: its request head did not arrive within %.0f s",
                 _peer(self.client), self.header_timeout)
        self._refuse(408, "the request head did not arrive in time")

    def _refuse(self, status: int, message: str) -> None:
        """A JSON error and close, written past h11 (whose state the bad request broke)."""
        self._disarm()
        if self.transport.is_closing():
            return
        reply = error_reply(status, message, _ERROR_TYPES.get(status, "BadRequestError"))
        body = json.dumps(reply.payload, separators=(",", ":")).encode()
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        head = (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        self.transport.close()


def protocol_with_header_timeout(header_timeout: float) -> type[HeadDeadlineProtocol]:
    """The protocol class uvicorn's `Config(http=...)` takes, with this server's deadline."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,),
                {"header_timeout": header_timeout})


def _peer(client: tuple[str, int] | None) -> str:
    return client[0] if client else "-"
