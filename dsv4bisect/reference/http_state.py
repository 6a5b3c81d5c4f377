"""What the embedded server's routes read, `ServerState`: the engine once loaded, the stop flag,
the requests admitted and the threads in the endpoint logic (shared by http_app.py, server.py
and event_stream.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from dsv4bisect.reference.native_api import ServerApi


class ServerState:
    """What the routes read: the engine once loaded, the stop flag, the requests in flight.
    The admission counts are touched only on the event loop; the thread count from threads."""

    def __init__(self, *, check_host: bool, checkpoint: str | None = None,
                 api_kind: str = "sglang") -> None:
        self.api: ServerApi | None = None  # set once the engine is loaded
        self.api_kind = api_kind  # whose API the routes serve: sglang | vllm (vllm_api.py) | sglang-router
        self.stopping = threading.Event()  # set first thing on a stop: cancels model work
        # bound to loopback, every client is on this machine and names it in `Host`; another
        # name there is a browser tricked by DNS rebinding (evil.example resolving to 127.0.0.1)
        self.check_host = check_host
        self.checkpoint = checkpoint
        self.admitted = {"model": 0, "light": 0}
        self._threads = 0  # request threads inside the endpoint logic
        self._threads_changed = threading.Condition()

    @property
    def phase(self) -> str:
        if self.stopping.is_set():
            return "stopping"
        return "starting" if self.api is None else "ready"

    @contextmanager
    def in_thread(self) -> Iterator[None]:
        with self._threads_changed:
            self._threads += 1
        try:
            yield
        finally:
            with self._threads_changed:
                self._threads -= 1
                self._threads_changed.notify_all()

    def wait_threads(self, deadline: float) -> bool:
        """Whether every request thread left the endpoint logic before `deadline` (monotonic)."""
        with self._threads_changed:
            return self._threads_changed.wait_for(
                lambda: self._threads == 0, max(0.0, deadline - time.monotonic()))
