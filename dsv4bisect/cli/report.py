"""`dsv4bisect report RUN_DIR`: re-render a run's report from its files (terminal, md, json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dsv4bisect.cli.options import Format, FormatOpt, Json
from dsv4bisect.report.run_report import load_run, render_markdown, terminal_lines, verdict_json
from dsv4bisect.ui.console import stdout


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    run_dir: Annotated[Path, typer.Argument(
        metavar="RUN_DIR", help="A directory written by `dsv4bisect run` or `bisect`.")],
    json_out: Json = False,
    fmt: FormatOpt = None,
) -> None:
    """Print a run's report: a terminal summary, the markdown report, or the verdict JSON.

    Reads run.json, verdict.json and the arms' config.json; starts nothing and writes nothing.
    Exit 0 when the directory could be read (5 when it is not a run directory), whatever the
    run's verdict was. A bisect run directory (bisect.json) gets its bisect report.
    """
    if (run_dir / "bisect.json").is_file():  # a bisect run directory
        _bisect(run_dir, json_out, fmt)
        return
    view = load_run(run_dir)
    if json_out:
        print(json.dumps(verdict_json(view), indent=2))
    elif fmt is Format.md:
        stdout().file.write(render_markdown(view))
    else:
        out = stdout()
        for text, style in terminal_lines(view):
            out.print(text, style=style, markup=False, highlight=False)


def _bisect(run_dir: Path, json_out: bool, fmt: Format | None) -> None:
    from dsv4bisect.report import bisect_report as br

    view = br.load_bisect(run_dir)
    if json_out:
        print(json.dumps(br.report_json(view), indent=2, default=str))
    elif fmt is Format.md:
        stdout().file.write(br.render_markdown(view))
    else:
        out = stdout()
        for text, style in br.terminal_lines(view):
            out.print(text, style=style, markup=False, highlight=False)
