"""`StopSignal` in this process: a SIGTERM reaches `on_stop` on the watcher thread whatever the
main thread does, a signal before `on_stop` is registered is kept, `close()` puts the previous
handlers back. (The process-level behaviour, exit 0 in every phase, is test_server_stop.py.)"""

from __future__ import annotations

import os
import signal
import threading

from dsv4bisect.reference.stop_signal import StopSignal

NEVER = 24 * 3600.0  # the watcher's os._exit(0) must not end pytest (and pass it) on a failure


def test_sigterm_reaches_the_callback_on_the_watcher_thread() -> None:
    before = signal.getsignal(signal.SIGTERM)
    signals = StopSignal.install(hard_exit_s=NEVER)
    called: list[tuple[int, str]] = []
    done = threading.Event()

    def on_stop(signum: int) -> None:
        called.append((signum, threading.current_thread().name))
        done.set()

    try:
        signals.on_stop(on_stop)
        os.kill(os.getpid(), signal.SIGTERM)
        assert done.wait(30)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal while stopping: ignored
    finally:
        signals.close()
    assert called == [(signal.SIGTERM, "stop-signal")]
    assert signals.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_before_on_stop_is_kept() -> None:
    signals = StopSignal.install(hard_exit_s=NEVER)
    done = threading.Event()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(300):  # until the watcher has read it (no callback yet)
            if signals.received is not None:
                break
            threading.Event().wait(0.1)
        got: list[int] = []
        signals.on_stop(lambda signum: (got.append(signum), done.set()))
        assert done.wait(30)
    finally:
        signals.close()
    assert got == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_close_without_a_signal_ends_the_watcher() -> None:
    signals = StopSignal.install(hard_exit_s=NEVER)
    signals.close()
    signals.close()  # idempotent
    assert signals.received is None
    assert not any(t.name == "stop-signal" and t.is_alive() for t in threading.enumerate())
