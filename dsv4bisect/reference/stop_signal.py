"""SIGTERM and SIGINT for a server whose main thread may be anywhere: a pipe and a thread.

The old design raised an exception from the signal handler into whatever the main thread was
running; during engine loading on a loaded machine that exception was twice lost (swallowed or
never raised where it could unwind) and the process ran on for 24-28 minutes. Here nothing
depends on the main thread: `signal.set_wakeup_fd` makes the interpreter's C-level handler
write the signal number into a pipe the moment the signal arrives, a watcher thread blocked on
that pipe calls `on_stop(signum)` and then holds the process to a hard deadline: if it has not
finished stopping `HARD_EXIT_S` after the signal, the watcher logs it and ends the process with
`os._exit(0)` (a thread stuck in torch would otherwise keep it alive or crash finalisation).
The Python-level handler does nothing; a second signal while stopping is ignored.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("dsv4bisect.reference.server")

HARD_EXIT_S = 8.0  # from the signal to os._exit(0) if stopping has not finished by then
SIGNALS = (signal.SIGTERM, signal.SIGINT)
_CLOSE = 0  # the byte close() writes: not a signal number


def _ignore(signum: int, frame: object) -> None:
    """Installed so the C-level handler runs (and writes the wakeup byte); the watcher acts."""


class StopSignal:
    """Installed from the main thread (signal handlers live there); `close()` undoes it."""

    def __init__(self, read_fd: int, write_fd: int, previous: dict[int, Any],
                 previous_wakeup: int, hard_exit_s: float) -> None:
        self._read_fd, self._write_fd = read_fd, write_fd
        self.hard_exit_s = hard_exit_s
        self._previous, self._previous_wakeup = previous, previous_wakeup
        self._on_stop: Callable[[int], None] | None = None
        self._pending: int | None = None  # a signal that came before on_stop was registered
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self.received: int | None = None
        self._thread = threading.Thread(target=self._watch, name="stop-signal", daemon=True)
        self._thread.start()

    @classmethod
    def install(cls, hard_exit_s: float = HARD_EXIT_S) -> StopSignal:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # set_wakeup_fd needs it; a full pipe drops the byte
        previous = {sig: signal.signal(sig, _ignore) for sig in SIGNALS}
        previous_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        return cls(read_fd, write_fd, previous, previous_wakeup, hard_exit_s)

    def on_stop(self, callback: Callable[[int], None]) -> None:
        """Call `callback(signum)` on the watcher thread at the first signal (at once if one
        came already)."""
        with self._lock:
            self._on_stop, pending = callback, self._pending
        if pending is not None:
            callback(pending)

    def close(self) -> None:
        """Stopping has finished (or serving ended without a signal): the deadline is off.
        Idempotent."""
        if self._finished.is_set():
            return
        self._finished.set()
        signal.set_wakeup_fd(self._previous_wakeup)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        try:
            os.write(self._write_fd, bytes([_CLOSE]))
        except OSError:
            pass
        self._thread.join(1.0)
        os.close(self._read_fd)
        os.close(self._write_fd)

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 1)
            except OSError:
                return
            if not data or data[0] == _CLOSE or self._finished.is_set():
                return
            if data[0] in SIGNALS:  # another handler's signal writes here too: not ours
                break
        signum = data[0]
        self.received = signum
        with self._lock:
            callback = self._on_stop
            if callback is None:
                self._pending = signum
        if callback is not None:
            try:
                callback(signum)
            except Exception:  # noqa: BLE001 - the deadline below must hold whatever happens
                log.exception("stopping after %s failed", signal.Signals(signum).name)
        if not self._finished.wait(self.hard_exit_s):
            log.error("the server did not stop within %.0f s of %s (a thread stuck in the "
                      "engine?); exiting without it", self.hard_exit_s,
                      signal.Signals(signum).name)
            exit_now()


def exit_now() -> None:
    """End the process with exit 0 after flushing stdout and stderr, without interpreter
    finalisation (with torch loaded that is seconds of CPU that no deadline covers)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)
