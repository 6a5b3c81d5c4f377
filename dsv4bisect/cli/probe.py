"""`dsv4bisect probe URL --baseline URL|RUN_DIR`: probe running servers, git-bisect exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dsv4bisect.cli.exit_policy import ExitPolicy, ExitPolicyOpt, WarnAsOpt, WarnExit
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.conditions import family_conditions, throughput_lines
from dsv4bisect.probe.runner import ProbeProgress
from dsv4bisect.probe.session import ProbeSession, probe_against, resolve_baseline, write_verdict
from dsv4bisect.probe.verdict import Verdict, exit_code_as
from dsv4bisect.report.heatmap import PLOTS_SKIPPED, render_heatmap
from dsv4bisect.ui.console import console
from dsv4bisect.base.unique_dir import make_unique_dir
from dsv4bisect.ui.progress import stage_label

_STYLE = {"PASS": "bold green", "FAIL": "bold red", "WARN": "bold yellow",
          "CANNOT_TEST": "bold magenta"}


def register(app: typer.Typer) -> None:
    app.command("probe")(probe)


def probe(
    url: Annotated[str, typer.Argument(help="The candidate server, e.g. http://127.0.0.1:30000.")],
    baseline: Annotated[str, typer.Option(
        "--baseline", metavar="URL|RUN_DIR",
        help="The good configuration: a running server, a run directory of `dsv4bisect run` "
             "(its baseline, A/A repeat and null model), or a directory from an earlier "
             "probe.")],
    tier: Annotated[Optional[str], typer.Option(
        help="ci, smoke (default), standard or deep; see docs/probe.md for each tier's power.")
    ] = None,
    families: Annotated[Optional[str], typer.Option(
        metavar="F,G", help="Only these families: needle, copy, vartrack, drift.")] = None,
    warmup_requests: Annotated[Optional[int], typer.Option(
        min=0, max=65536, metavar="N",
        help="The polluting phase: N requests of other conversations on each server before "
        "the measured ones (default: the tier's; standard and deep 256, docs/probe.md).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the verdict JSON on stdout.")
                        ] = False,
    api_key_env: Annotated[Optional[str], typer.Option(
        metavar="NAME", help="Environment variable holding the servers' API key.")] = None,
    out: Annotated[Optional[Path], typer.Option(
        metavar="DIR",
        help="Where to write the runs and verdict (default runs/probe-<UTC time>-<random>).")
    ] = None,
    warn_exit: WarnAsOpt = WarnExit.passed,
    exit_policy: ExitPolicyOpt = ExitPolicy.default,  # cli.main applies it to every exit
) -> None:
    """Probe a running server against a baseline and judge it.

    Exit codes work with `git bisect run`: 0 PASS, 1 FAIL, 125 CANNOT_TEST; a drift-only WARN
    exits 0 (4 with --warn-as warn, 1 with --warn-as fail); 5 bad input, which
    --exit-policy git-bisect turns into 125 (skip).
    """
    fams = None if families is None else tuple(f.strip() for f in families.split(",") if f.strip())
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ConfigError(f"environment variable `{api_key_env}` is not set",
                              f"export {api_key_env}=<key>, or drop --api-key-env")
    source = resolve_baseline(baseline, tier, fams, warmup_requests)
    out_dir = out or make_unique_dir(Path("runs"), "probe")
    with _StageProgress() as progress:
        session = probe_against(url, source, out_dir, api_key=api_key,
                                on_progress=progress)
    verdict = _with_heatmap(session)
    _summary(verdict, session)
    if json_out:
        print(json.dumps(verdict.to_dict(), indent=2))
    raise typer.Exit(exit_code_as(verdict.verdict, warn_exit.value))


def _with_heatmap(session: ProbeSession) -> Verdict:
    png = render_heatmap(session.baseline.rows, session.candidate.rows,
                         session.out_dir / "heatmap.png",
                         title=f"{session.verdict.verdict}: {session.candidate.url}",
                         verdict=session.verdict.to_dict())
    if png is None:
        console().print(PLOTS_SKIPPED, markup=False)
    verdict = session.verdict.with_evidence(heatmap=str(png) if png else None)
    write_verdict(session.out_dir, verdict)
    return verdict


class _StageProgress:
    """Rich progress on stderr: one bar per stage (baseline, A/A repeat, candidate)."""

    def __init__(self) -> None:
        con = console()
        self._bar = Progress(TextColumn("{task.description:<22}"), BarColumn(),
                             MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                             TimeElapsedColumn(), console=con, disable=not con.is_terminal)
        self._tasks: dict[str, int] = {}
        self._plain = not con.is_terminal
        self._printed: set[str] = set()

    def __enter__(self) -> _StageProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)  # type: ignore[arg-type]

    def __call__(self, stage: str, p: ProbeProgress) -> None:
        name = stage_label(stage, p.phase)
        acc = f"acc {p.accuracy:.0%}" if p.accuracy is not None else ""
        info = f"{p.tokens_per_s:,.0f} tok/s {acc}" if p.phase == "probe" else ""
        if name not in self._tasks:
            self._tasks[name] = self._bar.add_task(name, total=p.total, info="")
        self._bar.update(self._tasks[name], completed=p.done, total=p.total, info=info)
        if self._plain and p.done == p.total and name not in self._printed:
            self._printed.add(name)  # off a TTY: one line per finished stage
            console().print(f"{name}: {p.done}/{p.total} {info}".rstrip(), markup=False)


def _summary(v: Verdict, session: ProbeSession) -> None:
    con = console()
    con.print(f"{v.verdict}", style=_STYLE[v.verdict], markup=False, end="")
    con.print(f"  {session.candidate.url} ({v.probe['tier']} tier, spec "
              f"{v.probe['spec_hash']}, seed block {v.probe['seed_block']})", markup=False)
    for fam, r in v.families.items():
        acc = (f"{r.baseline_accuracy:.0%} → {r.candidate_accuracy:.0%}"
               if r.baseline_accuracy is not None else "-")
        con.print(f"  {fam:<9} {acc:<12} n={r.n:<4} lost {r.b}, gained {r.c}, "
                  f"p={r.p_value:.2g}{'' if r.evidence else '  (no evidence)'}", markup=False)
        con.print(f"            ran {family_conditions(v.conditions.get(fam))}", markup=False)
    if "drift" in v.conditions:
        con.print(f"  drift     ran {family_conditions(v.conditions['drift'])}", markup=False)
    for line in throughput_lines(v.throughput):
        con.print(f"  {line}", markup=False)
    for reason in v.reasons:
        con.print(f"  - {reason}", markup=False)
    con.print(f"run dir: {session.out_dir}", markup=False)
