"""`dsv4bisect run [PROFILE]`: judge a configuration against its good end, end to end.

Progress (engines starting with their last log line; probe stages with requests, tokens/s and
running accuracy) goes to stderr; results go to stdout only with `--json` or `--format md`.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from dsv4bisect.cli.exit_policy import ExitPolicy, ExitPolicyOpt, WarnAsOpt, WarnExit
from dsv4bisect.cli.options import (
    Disable,
    Enable,
    Format,
    FormatOpt,
    Json,
    Only,
    Set,
    one_output,
    overrides,
)
from dsv4bisect.probe.verdict import exit_code_as
from dsv4bisect.redact import redact
from dsv4bisect.report.run_report import load_run, render_markdown, terminal_lines
from dsv4bisect.run.events import EngineEvent, Notice, ProbeEvent, RunEvent
from dsv4bisect.run.session import DEFAULT_PROFILE, RunRequest
from dsv4bisect.run.session import run as run_session
from dsv4bisect.run.signals import interrupts
from dsv4bisect.ui.console import console, stdout
from dsv4bisect.ui.progress import ready_detail, stage_label


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    profile: Annotated[str, typer.Argument(
        help="Profile: a YAML file or a built-in name (default: reference-all, the six patches "
             "on the embedded engine).")] = DEFAULT_PROFILE,
    tier: Annotated[Optional[str], typer.Option(
        help="Probe tier: ci, smoke, standard, deep (default: the profile's probe.tier).")
    ] = None,
    seed_block: Annotated[Optional[int], typer.Option(
        "--seed-block", min=0, max=1_000_000,
        help="Draw the probe's requests from this seed block (default 0); a bisect's re-test "
             "of a configuration uses the next block, and its report's Reproduce line says "
             "which.")] = None,
    json_out: Json = False,
    fmt: FormatOpt = None,
    out: Annotated[Path, typer.Option(
        "--out", metavar="RUNS_ROOT", help="Where run directories are created.")
    ] = Path("runs"),
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Measure the baseline again instead of reusing a cached one.")
    ] = False,
    enable: Enable = None,
    disable: Disable = None,
    only: Only = None,
    sets: Set = None,
    warn_exit: WarnAsOpt = WarnExit.passed,  # the exit code of a WARN, not the bisect's rule
    exit_policy: ExitPolicyOpt = ExitPolicy.default,  # cli.main applies it to every exit
    skip_preflight: Annotated[bool, typer.Option(
        "--skip-preflight", help="Launch without checking the engine's Python, SGLang, the "
                                 "model, GPUs and ports first (docs/run.md).")] = False,
) -> None:
    """Launch the good end and the candidate, probe both, and judge the candidate.

    The good end is the same profile with every patch off except the required ones. Exit codes:
    0 PASS, 1 FAIL (facts lost, hard signatures, a crash), 4 WARN (drift only) with
    `--warn-as warn` (default: 0), 5 bad input, 125 cannot test, 130 interrupted. Inside `git
    bisect run`, pass `--exit-policy git-bisect`: a commit that cannot be tested (its profile
    does not validate, a file is missing) then exits 125 and is skipped, not blamed.
    """
    one_output(json_out, fmt)
    ov = overrides(enable, disable, only, sets)
    if not skip_preflight:  # seconds instead of a failed launch (engines/preflight.py)
        from dsv4bisect.engines.preflight import require

        require(profile, ov)
    request = RunRequest(profile=profile, overrides=ov, tier=tier, seed_block=seed_block,
                         runs_root=out, use_cache=not no_cache,
                         command=("dsv4bisect", *sys.argv[1:]), warn_exit=warn_exit.value,
                         exit_policy=exit_policy.value)
    display = RunDisplay()
    try:
        with interrupts(), display:
            outcome = run_session(request, display)
    except KeyboardInterrupt:
        where = f"; what was measured is in {display.run_dir}" if display.run_dir else ""
        console().print(f"interrupted: every engine was stopped{where}", style="yellow",
                        markup=False)
        raise
    view = load_run(outcome.run_dir)
    con = console()
    for text, style in terminal_lines(view):
        con.print(text, style=style, markup=False, highlight=False)
    if json_out:
        print(json.dumps(redact(outcome.verdict.to_dict(), view.secrets), indent=2))
    elif fmt is Format.md:
        stdout().file.write(render_markdown(view))
    raise typer.Exit(exit_code_as(outcome.verdict.verdict, warn_exit.value))


class RunDisplay:
    """Live view on stderr: engine processes (state, last log line) and probe stages.

    Thread-safe (the A/A repeat reports from its own thread). Off a terminal it prints one plain
    line per engine state change, finished stage and notice instead.
    """

    def __init__(self) -> None:
        self._con = console()
        self._plain = not self._con.is_terminal
        self._lock = threading.Lock()
        self._engines: dict[tuple[str, str], tuple[str, str, int]] = {}  # state, line, attempt
        self._bar = Progress(TextColumn("{task.description:<22}"), BarColumn(),
                             MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                             TimeElapsedColumn(), console=self._con)
        self._tasks: dict[str, Any] = {}
        self._done: set[str] = set()
        self._live: Live | None = None
        self.run_dir: str | None = None

    def __enter__(self) -> RunDisplay:
        if not self._plain:
            self._live = Live(get_renderable=self._render, console=self._con,
                              refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def __call__(self, event: RunEvent) -> None:
        with self._lock:
            if isinstance(event, EngineEvent):
                self._engine(event)
            elif isinstance(event, ProbeEvent):
                self._probe(event)
            elif isinstance(event, Notice):
                if event.run_dir:
                    self.run_dir = event.run_dir
                self._say(event.text, "yellow" if event.level == "warn" else "dim")

    def _say(self, text: str, style: str | None = None) -> None:
        if self._live is not None:
            self._live.console.print(text, style=style, markup=False, highlight=False)
        else:
            self._con.print(text, style=style, markup=False, highlight=False)

    def _engine(self, e: EngineEvent) -> None:
        key = (e.arm, e.role)
        before = self._engines.get(key)
        line = e.line or (before[1] if before else "")
        self._engines[key] = (e.state, line, e.attempt)
        if self._plain and (before is None or before[0] != e.state or before[2] != e.attempt):
            attempt = f" (attempt {e.attempt})" if e.attempt > 1 else ""
            detail = _clip(ready_detail(e.line), 300) if e.state != "starting" else ""
            self._say(f"{e.arm} {e.role}{attempt}: {e.state}" + (f" - {detail}" if detail else ""))

    def _probe(self, e: ProbeEvent) -> None:
        p = e.progress
        name = stage_label(e.stage, p.phase)
        acc = f" acc {p.accuracy:.0%}" if p.accuracy is not None else ""
        info = f"{p.tokens_per_s:,.0f} tok/s{acc}" if p.phase == "probe" else ""
        if name not in self._tasks:
            self._tasks[name] = self._bar.add_task(name, total=p.total, info="")
        self._bar.update(self._tasks[name], completed=p.done, total=p.total, info=info)
        if self._plain and p.done >= p.total and name not in self._done:
            self._done.add(name)
            self._say(f"{name}: {p.done}/{p.total} {info}".rstrip())

    def _render(self) -> RenderableType:
        with self._lock:
            lines: list[RenderableType] = []
            for (arm, role), (state, line, attempt) in self._engines.items():
                style = {"ready": "green", "exited": "red", "stopped": "dim"}.get(state, "yellow")
                label = f"{arm} {role}" + (f" #{attempt}" if attempt > 1 else "")
                lines.append(Text.assemble((f"{label:<22}", "bold"), (f"{state:<9}", style),
                                           (line.strip(), "dim"), no_wrap=True,
                                           overflow="ellipsis"))
            if self._tasks:
                lines.append(self._bar)
            return Group(*lines)


def _clip(text: str, width: int) -> str:
    text = text.replace("\r", " ").strip()
    return text if len(text) <= width else text[: width - 1] + "…"
