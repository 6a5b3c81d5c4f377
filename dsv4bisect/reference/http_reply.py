"""A reply of the embedded server and how it goes out, shared by its two responders (http_app.py
answers in one piece, event_stream.py streams): `Reply`, SGLang's error shape (`error_reply`),
the Starlette response a reply becomes (`as_response`: vLLM's error shape under `serve --api
vllm`), and the watch that sees the client hang up (`CANCELLED_KEY` marks the request's log
line 499)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from dsv4bisect.reference.http_state import ServerState
from dsv4bisect.reference.vllm_api import vllm_error

CANCELLED_KEY = "dsv4bisect.cancelled"  # scope key: the client left, its generation was cancelled


@dataclass(frozen=True)
class Reply:
    status: int
    payload: Any = None  # JSON value, str (text/plain) or None (empty body)
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # Connection: close (the request's body may be unread)


def error_reply(status: int, message: str, err_type: str, *, close: bool = False) -> Reply:
    """SGLang's flat ErrorResponse, plus the `error` envelope its `/generate` and newer
    OpenAI routes use, so clients of either shape find the message."""
    return Reply(status, {"object": "error", "message": message, "type": err_type, "param": None,
                          "code": status,
                          "error": {"message": message, "type": err_type, "code": status}},
                 close=close)


def reply_bytes(reply: Reply) -> tuple[bytes, str]:
    """The body and its Content-Type."""
    if reply.payload is None:
        return b"", "text/plain; charset=utf-8"
    if isinstance(reply.payload, str):
        return reply.payload.encode(), "text/plain; charset=utf-8"
    text = json.dumps(reply.payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        return text.encode(), "application/json"
    except UnicodeEncodeError:  # a lone surrogate got through: escape it, stay JSON
        return json.dumps(reply.payload, allow_nan=False, separators=(",", ":")).encode(), \
            "application/json"


def as_response(reply: Reply, state: ServerState) -> Response:
    if state.api_kind == "vllm" and isinstance(reply.payload, dict) \
            and reply.payload.get("object") == "error":  # vLLM's ErrorResponse only
        err = reply.payload["error"]
        reply = Reply(reply.status, vllm_error(reply.status, err["message"], err["type"]),
                      reply.headers, reply.close)
    data, ctype = reply_bytes(reply)
    headers = {"content-type": ctype, **dict(reply.headers)}
    if reply.close or state.stopping.is_set():
        headers["connection"] = "close"
    return Response(data, status_code=reply.status, headers=headers)


async def watch_disconnect(receive: Receive, gone: threading.Event) -> None:
    """With the body read, the next ASGI message is `http.disconnect`: the client hung up (or
    the reply went out; the watch is cancelled before that)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return
