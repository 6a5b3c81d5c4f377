"""`dsv4bisect report RUN_DIR`: re-render a run's report from its files (terminal, md, json)."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4bisect.cli.options import Json
from dsv4bisect.report.run_report import load_run, render_markdown, terminal_lines, verdict_json
from dsv4bisect.ui.console import stdout


class Format(str, Enum):
    md = "md"


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR",
                                            help="A directory written by `dsv4bisect run`.")],
    json_out: Json = False,
    fmt: Annotated[Optional[Format], typer.Option(
        "--format", help="md: the markdown report (what report.md holds).")] = None,
) -> None:
    """Print a run's report: a terminal summary, the markdown report, or the verdict JSON.

    Reads run.json, verdict.json and the arms' config.json; starts nothing and writes nothing.
    Exit 0 when the directory could be read (5 when it is not a run directory), whatever the
    run's verdict was.
    """
    view = load_run(run_dir)
    if json_out:
        print(json.dumps(verdict_json(view), indent=2))
    elif fmt is Format.md:
        stdout().file.write(render_markdown(view))
    else:
        out = stdout()
        for text, style in terminal_lines(view):
            out.print(text, style=style, markup=False, highlight=False)
