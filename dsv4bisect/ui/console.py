"""The one Rich console (stderr) and small rendering helpers.

stdout carries only results (`--json`, `--format md`); everything else goes here. Untrusted text
(engine logs, model outputs, profile values) is printed with markup off.
"""

from __future__ import annotations

import os
import sys
from functools import cache

from rich.console import Console


# Off a terminal (piped, redirected, captured) nothing is hard-wrapped: a line, or a table row,
# is as long as its content. COLUMNS, when set, still wins (Rich reads it).
UNWRAPPED = 100_000


def _width(stream: object) -> int | None:
    if os.environ.get("COLUMNS"):
        return None
    isatty = getattr(stream, "isatty", None)
    try:
        return None if callable(isatty) and isatty() else UNWRAPPED
    except ValueError:  # a closed stream
        return UNWRAPPED


class _Console(Console):
    """Rich's console, except that a reader closing the pipe (`| head -2`) is not an error:
    Rich exits 1 there; the CLI exits 0 as it does for a plain `print` (cli/__init__.py)."""

    def on_broken_pipe(self) -> None:
        if self.quiet:
            return
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.file.fileno())
        except (OSError, AttributeError, ValueError):  # a captured stream has no descriptor
            pass
        raise SystemExit(0)


@cache
def console() -> Console:
    """The stderr console; honours NO_COLOR and degrades to plain, unwrapped lines off a TTY."""
    return _Console(stderr=True, highlight=False, emoji=False, soft_wrap=True,
                   width=_width(sys.stderr))


@cache
def stdout() -> Console:
    """A console for results on stdout (tables rendered as results, e.g. `patches list`)."""
    return _Console(highlight=False, emoji=False, no_color=bool(os.environ.get("NO_COLOR")),
                   width=_width(sys.stdout))


def error(message: str, hint: str | None = None) -> None:
    con = console()
    con.print(f"error: {message}", markup=False, style="bold red")
    if hint:
        con.print(f"hint: {hint}", markup=False, style="yellow")
