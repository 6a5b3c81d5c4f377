"""Signals for long runs: Ctrl-C and SIGTERM interrupt, and teardown is not interrupted twice.

Inside `interrupts()`, SIGINT and SIGTERM raise KeyboardInterrupt in the main thread *and* set a
flag. The flag matters because CPython swallows an exception raised while a `__del__` runs
("Exception ignored in ..."): a Ctrl-C that lands while, say, an HTTP connection is being
collected would be lost. The run's waiting points (`check_interrupt`) raise again from the flag.

All of this acts in the main thread only (Python delivers signals there).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A plain flag, not a threading.Event: Event.set() takes a lock, and a second signal arriving
# while the handler holds it would deadlock the main thread against itself.
_state = {"interrupted": False}


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    _state["interrupted"] = True
    raise KeyboardInterrupt()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def check_interrupt() -> None:
    """In the main thread: raise KeyboardInterrupt if an interrupt arrived (even one whose
    first KeyboardInterrupt was swallowed). Call it only where an exception is safe."""
    if _state["interrupted"] and _main_thread():
        raise KeyboardInterrupt()


@contextmanager
def interrupts() -> Iterator[None]:
    """Inside: SIGINT and SIGTERM raise KeyboardInterrupt and are remembered (exit 130 path)."""
    if not _main_thread():
        yield
        return
    _state["interrupted"] = False
    previous = {sig: signal.signal(sig, _interrupt) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state["interrupted"] = False


@contextmanager
def shielded() -> Iterator[None]:
    """Inside: SIGINT and SIGTERM are ignored, so a second Ctrl-C cannot cut a teardown short
    and leave an engine running."""
    if not _main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
