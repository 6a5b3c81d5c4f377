"""Run the real CLI entry point (`dsv4bisect.cli.main`) in-process, as a user would see it.

In-process keeps the corpus fast (no interpreter start per case); it goes through `main`, the
same final handler a subprocess gets, so a traceback or exit 70 here is one a user would see.
An alarm turns a hang into a failure instead of a stuck CI job.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass

from typer.testing import CliRunner  # typer vendors click: no click package on a fresh machine

from dsv4bisect.cli import main

ALLOWED = {0, 1, 2, 4, 5, 125, 130}  # DESIGN §9; 70 is "internal error" = our bug
LIMIT_S = 20.0


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str
    seconds: float

    def assert_clean(self) -> None:
        """Answered in time, no traceback, a documented exit code (never 70)."""
        assert self.seconds < LIMIT_S, f"took {self.seconds:.1f} s"
        assert "Traceback" not in self.err and "internal error" not in self.err, self.err[-2000:]
        assert self.code in ALLOWED, (self.code, self.err[-2000:])

    def assert_error(self) -> None:
        """Bad input: exit 5 (or 2 for click usage), one `error:` line and a `hint:`."""
        self.assert_clean()
        assert self.code in (2, 5), (self.code, self.err[-500:])
        if self.code == 5:
            lines = [line for line in self.err.splitlines() if line.strip()]
            assert any(line.startswith("error: ") for line in lines), self.err[-500:]
            assert any(line.startswith("hint: ") for line in lines), self.err[-500:]


class _NoAnswer(BaseException):
    """Raised by the alarm; a BaseException so that main()'s handlers do not swallow it."""


def _alarm(signum: int, frame: object) -> None:
    raise _NoAnswer


def cli(*args: str) -> Result:
    """Run in the main thread (commands install signal handlers), bounded by SIGALRM."""
    runner = CliRunner()
    code = 0
    escaped = ""
    with runner.isolation() as (out, err, _):
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
        start = time.perf_counter()
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        except _NoAnswer:
            raise AssertionError(f"dsv4bisect {' '.join(a[:40] for a in args)}: no answer in "
                                 f"{LIMIT_S:.0f} s") from None
        except BaseException as exc:  # noqa: BLE001 - main() must not let anything out
            code, escaped = 70, repr(exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        seconds = time.perf_counter() - start
        sys.stdout.flush()  # the isolation's text wrappers buffer
        sys.stderr.flush()
        text_out = out.getvalue().decode(errors="replace")
        text_err = err.getvalue().decode(errors="replace")
    if escaped:
        text_err += f"\nTraceback (escaped main): {escaped}"
    return Result(code, text_out, text_err, seconds)
