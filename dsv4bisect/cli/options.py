"""Options shared by every command that takes a profile."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from dsv4bisect.config.resolve import Overrides

ProfileArg = Annotated[str, typer.Argument(help="Profile: a YAML file or a built-in name.")]
Enable = Annotated[Optional[list[str]], typer.Option(
    "--enable", metavar="PATCH", help="Turn a patch on (repeatable).")]
Disable = Annotated[Optional[list[str]], typer.Option(
    "--disable", metavar="PATCH", help="Turn a patch off (repeatable).")]
Only = Annotated[Optional[str], typer.Option(
    "--only", metavar="P,Q", help="Exactly these patches on, all others off.")]
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


def overrides(enable: list[str] | None, disable: list[str] | None, only: str | None,
              sets: list[str] | None) -> Overrides:
    only_names = None if only is None else tuple(n.strip() for n in only.split(",") if n.strip())
    return Overrides(sets=tuple(sets or ()), enable=tuple(enable or ()),
                     disable=tuple(disable or ()), only=only_names)
