"""`dsv4bisect report RUN_DIR`: re-render a run's report from its files (terminal, md, json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dsv4bisect.base.bounded import json_object, load_json
from dsv4bisect.cli.options import Format, FormatOpt, Json, one_output
from dsv4bisect.config.layering import is_dir
from dsv4bisect.errors import ConfigError
from dsv4bisect.report.run_report import (
    RunView,
    load_run,
    render_markdown,
    terminal_lines,
    verdict_json,
)
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
    one_output(json_out, fmt)
    if not is_dir(run_dir):
        raise ConfigError(f"`{str(run_dir)[:200]}` is not a run directory",
                          "pass a directory written by `dsv4bisect run` or `bisect`")
    if (run_dir / "bisect.json").is_file():  # a bisect run directory
        _check_bisect_file(run_dir / "bisect.json")
        _bisect(run_dir, json_out, fmt)
        return
    view = load_run(run_dir)
    try:
        _render(view, json_out, fmt)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # load_run checks the fields reports rely on; deeper fields of a hand-edited file can
        # still be of the wrong type. That is bad input, not a dsv4bisect bug.
        raise ConfigError(f"`{run_dir}`: a run file holds a value of the wrong shape "
                          f"({type(exc).__name__}: {str(exc)[:60]})",
                          "the run directory was edited or truncated; re-run the command that "
                          "wrote it") from None


def _render(view: RunView, json_out: bool, fmt: Format | None) -> None:
    if json_out:
        print(json.dumps(verdict_json(view), indent=2))
    elif fmt is Format.md:
        stdout().file.write(render_markdown(view))
    else:
        out = stdout()
        for text, style in terminal_lines(view):
            out.print(text, style=style, markup=False, highlight=False)


def _check_bisect_file(path: Path) -> None:
    """bisect.json names the run and its ledger; check its shape before opening the ledger."""
    data = json_object(load_json(path, "run"), str(path), "a bisect run file",
                       "pass the directory a `dsv4bisect bisect` wrote")
    for key in ("run_id", "ledger"):
        if not isinstance(data.get(key), str):
            raise ConfigError(f"{path}: `{key}` is missing or not a string",
                              "the file was edited or truncated; it cannot be reported")


def _bisect(run_dir: Path, json_out: bool, fmt: Format | None) -> None:
    from dsv4bisect.bisect import report as br

    view = br.load_bisect(run_dir)
    if json_out:
        print(json.dumps(br.report_json(view), indent=2, default=str))
    elif fmt is Format.md:
        stdout().file.write(br.render_markdown(view))
    else:
        out = stdout()
        for text, style in br.terminal_lines(view):
            out.print(text, style=style, markup=False, highlight=False)
