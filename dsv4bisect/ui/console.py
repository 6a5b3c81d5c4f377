"""The one Rich console (stderr) and small rendering helpers.

stdout carries only results (`--json`, `--format md`); everything else goes here. Untrusted text
(engine logs, model outputs, profile values) is printed with markup off.
"""

from __future__ import annotations

import os
from functools import cache

from rich.console import Console


@cache
def console() -> Console:
    """The stderr console; honours NO_COLOR and degrades to plain lines off a TTY."""
    return Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)


@cache
def stdout() -> Console:
    """A console for results on stdout (tables rendered as results, e.g. `patches list`)."""
    return Console(highlight=False, emoji=False, no_color=bool(os.environ.get("NO_COLOR")))


def error(message: str, hint: str | None = None) -> None:
    con = console()
    con.print(f"error: {message}", markup=False, style="bold red")
    if hint:
        con.print(f"hint: {hint}", markup=False, style="yellow")
