"""Work beside the main thread, with its exception handed back to whoever waits for it.

The threads are daemons: an interrupted run stops its engines from the main thread and exits
without waiting for a probe that is failing against a stopped engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from dsv4bisect.run.signals import check_interrupt

T = TypeVar("T")
JOIN_POLL_S = 0.2  # short waits keep Ctrl-C responsive in the main thread


class Background(Generic[T]):
    """`work()` on a daemon thread; `result()` waits, then returns its value or re-raises."""

    def __init__(self, work: Callable[[], T], name: str = "dsv4bisect-run") -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(work,), daemon=True, name=name)
        self._thread.start()

    def _main(self, work: Callable[[], T]) -> None:
        try:
            self._value = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._error = exc

    def result(self) -> T:
        while self._thread.is_alive():
            self._thread.join(timeout=JOIN_POLL_S)
            check_interrupt()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def deferred(work: Callable[[], T], passthrough: tuple[type[BaseException], ...] = ()
             ) -> Callable[[], T]:
    """Run `work` now; return a function giving its result or re-raising its exception later.

    Exceptions of the `passthrough` types (and KeyboardInterrupt) propagate at once.
    """
    try:
        value = work()
    except (KeyboardInterrupt, *passthrough):
        raise
    except BaseException as exc:  # noqa: BLE001 - re-raised by the returned function
        error = exc

        def fail() -> T:
            raise error

        return fail
    return lambda: value
