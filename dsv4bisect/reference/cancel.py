"""Stopping a request between two model steps: the condition, the exception, the scope.

The server knows when nobody waits for an answer any more (the client hung up, the server is
stopping); the engine knows where it may stop (between prefill chunks and decode steps). A
`StopCheck` carries the one to the other. It lives in the request's context (`stop_when`) rather
than in every signature: the endpoint handlers are request-to-JSON functions, and whether the
answer is still wanted is the transport's business. Torch-free, so the server imports it before
the engine loads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

StopCheck = Callable[[], bool]  # polled between model steps; True abandons the request


class Cancelled(Exception):  # noqa: N818 - a state, not a failure
    """A request abandoned because its `StopCheck` said so. Not a Dsv4BisectError: nobody is
    left to tell; the server logs it and sends nothing (or a 503 while stopping)."""


_current: ContextVar[StopCheck | None] = ContextVar("should_stop", default=None)


@contextmanager
def stop_when(check: StopCheck) -> Iterator[None]:
    """Model work started in this block (on this thread) stops once `check()` is true."""
    token = _current.set(check)
    try:
        yield
    finally:
        _current.reset(token)


def current_check() -> StopCheck | None:
    return _current.get()


def raise_if_stopped(check: StopCheck | None) -> None:
    if check is not None and check():
        raise Cancelled
