"""Options shared by every command that takes a profile."""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Optional

import typer

from dsv4bisect.config.resolve import Overrides
from dsv4bisect.errors import ConfigError

ProfileArg = Annotated[str, typer.Argument(help="Profile: a YAML file or a built-in name.")]
Enable = Annotated[Optional[list[str]], typer.Option(
    "--enable", metavar="PATCH", help="Turn a patch on (repeatable).")]
Disable = Annotated[Optional[list[str]], typer.Option(
    "--disable", metavar="PATCH", help="Turn a patch off (repeatable).")]
Only = Annotated[Optional[str], typer.Option(
    "--only", metavar="P,Q", help="Exactly these patches on, all others off; `none`: every "
                                  "patch off (the good end).")]
Set = Annotated[Optional[list[str]], typer.Option(
    "--set", metavar="KEY=VALUE",
    help="Override a profile key, e.g. engine.tp=4 (repeatable); "
         "--set patches.P.variant=V also enables P.")]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]


class Format(str, Enum):
    """`--format`: what to print on stdout besides the summary on stderr."""

    md = "md"


FormatOpt = Annotated[Optional[Format], typer.Option(
    "--format", help="md: print the markdown report (report.md) on stdout.")]


def one_output(json_out: bool, fmt: Format | None) -> None:
    """stdout carries one result: JSON or markdown, not both interleaved."""
    if json_out and fmt is not None:
        raise ConfigError("--json and --format md both ask for stdout",
                          "choose one: --json for the machine-readable result, --format md "
                          "for the report")


def finite(low: float, high: float) -> Callable[..., float | None]:
    """A Typer callback: the value is a finite number in [low, high] (click lets nan/inf in)."""
    def check(param: typer.CallbackParam, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            flag = (param.opts or [param.name or "value"])[0]
            raise ConfigError(f"{flag} {value}: outside [{low:g}, {high:g}]",
                              "give a finite number in that range")
        return value
    return check


ONLY_NONE = "none"  # `--only none`: every patch off, said on purpose (bisect's --good takes it)


def overrides(enable: list[str] | None, disable: list[str] | None, only: str | None,
              sets: list[str] | None) -> Overrides:
    if only is not None and only.strip().lower() == ONLY_NONE:
        only_names: tuple[str, ...] | None = ()
    else:
        only_names = None if only is None else tuple(n.strip() for n in only.split(",")
                                                     if n.strip())
        if only is not None and not only_names:
            # `--only ,,,` would quietly mean "every patch off": the good end, tested against
            # itself; that is asked for by name.
            raise ConfigError(f"--only {only!r} names no patch",
                              "list patches, e.g. --only mma-decode,triton-indexer "
                              "(`dsv4bisect patches list`), or --only none for every patch "
                              "off; --disable turns single patches off")
    return Overrides(sets=tuple(sets or ()), enable=tuple(enable or ()),
                     disable=tuple(disable or ()), only=only_names)
