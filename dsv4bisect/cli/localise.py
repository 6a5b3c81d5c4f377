"""`dsv4bisect localise PROFILE|BISECT_DIR`: the first module (layer, module path, op) where the
culprit configuration leaves the good end's numbers, or the state that differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dsv4bisect.cli.options import Disable, Enable, Json, Only, Set, overrides
from dsv4bisect.ui.console import console

if TYPE_CHECKING:
    from dsv4bisect.localise.result import LocaliseResult


def register(app: typer.Typer) -> None:
    app.command("localise")(localise)


def localise(
    target: Annotated[str, typer.Argument(
        metavar="PROFILE|BISECT_DIR", help="A profile (the bad end: what `run` would launch "
        "with the same flags), or a bisect's run directory (its bad end and culprit).")],
    enable: Enable = None,
    disable: Disable = None,
    only: Only = None,
    sets: Set = None,
    culprit: Annotated[str | None, typer.Option(
        "--culprit", metavar="P,Q", help="The culprit patches, reverted for the good end "
        "(default: what the flags changed against the profile).")] = None,
    revert: Annotated[str, typer.Option(
        metavar="fault|patch", help="A culprit running a fault variant goes back to its "
        "patch's default variant (`fault`, the default) or off (`patch`).")] = "fault",
    tier: Annotated[str | None, typer.Option(
        help="Probe tier whose cases are used without a run (default: the profile's).")] = None,
    cases: Annotated[int, typer.Option(
        min=1, max=64, help="Cases to run, longest first (each ~1 min on a 2-core CPU).")] = 1,
    from_runs: Annotated[list[Path] | None, typer.Option(
        "--from", metavar="RUN_DIR", help="A `run` directory whose lost cases to use "
        "(repeatable).")] = None,
    out: Annotated[Path, typer.Option(
        metavar="DIR", help="Where the report directory is made.")] = Path("runs"),
    json_out: Json = False,
) -> None:
    """Name the first module where the culprit leaves the good end's numbers.

    Both configurations run teacher-forced on the same tokens (the cases that lost facts, else
    drift transcripts); every module's inputs and outputs and the named functional ops are
    compared position by position against each site's own A/A envelope (the good end
    re-chunked and re-batched). Then the state a prefix-cache hit restores is compared with a
    cold prefill, and speculative rounds with greedy decoding. Exit 0: a divergence named; 1:
    none (the ends agree within their envelopes); 5: bad input; 125: could not run.
    """
    from dsv4bisect.errors import ConfigError
    from dsv4bisect.localise.driver import Question

    if revert not in ("fault", "patch"):
        raise ConfigError(f"--revert {revert}: unknown", "use --revert fault or --revert patch")
    names = tuple(n.strip() for n in culprit.split(",") if n.strip()) if culprit else None
    for run_dir in from_runs or ():
        if not run_dir.is_dir():
            raise ConfigError(f"--from {run_dir}: not a directory",
                              "pass a `run` directory (it holds baseline/ and candidate/)")
    flags = overrides(enable, disable, only, sets)
    root = Path(target)
    if (root / "bisect.json").is_file():
        if any((enable, disable, only, sets, names)):
            raise ConfigError("a bisect directory brings its own ends and culprit",
                              "drop --only/--enable/--disable/--set/--culprit, or localise "
                              "the profile instead")
        from dsv4bisect.bisect.localise_input import read_bisect

        question = Question(bisect=read_bisect(root), revert=revert, tier=tier, cases=cases,
                            from_runs=tuple(from_runs or ()), out=out)
    else:
        question = Question(profile=target, overrides=flags, culprit=names, revert=revert,
                            tier=tier, cases=cases, from_runs=tuple(from_runs or ()), out=out)
    from dsv4bisect.localise.driver import localise as run_localise

    con = console()
    result, directory = run_localise(question, lambda msg: con.print(f"[dim]localise:[/] {msg}",
                                                                     highlight=False))
    _summary(result, directory)
    if json_out:
        print(json.dumps(result.to_json(), indent=2))
    raise typer.Exit(0 if result.first_divergence is not None else 1)


def _summary(res: LocaliseResult, directory: Path) -> None:
    from rich.text import Text

    con = console()
    f = res.first_divergence
    if f is None:
        con.print(Text("first divergence: none — every site of the bad end stays inside the "
                       "good end's envelope", style="green"))
    else:
        mult = "" if f.multiple is None else f" ×{f.multiple:.3g} its envelope"
        inputs = "" if f.inputs_multiple is None else f", inputs ×{f.inputs_multiple:.3g}"
        con.print(Text(f"first divergence: {f.module} {f.op} (layer {f.layer}, {f.kind})"
                       f"{mult}{inputs}; first positions {f.positions[:6]} of {f.case}",
                       style="bold red"))
        con.print(Text(f"  {f.what}; code of: {', '.join(f.acts_on) or '-'}"))
    if res.state is not None and res.state.first is not None and res.state.first is not f:
        s = res.state.first
        con.print(Text(f"state: {s.module} {s.op} ×{s.multiple:.3g} on a prefix-cache hit"))
    if res.alignment is not None and not res.alignment["bit_identical"]:
        con.print(Text("warning: the embedding is not bit-identical in both ends: the runs "
                       "are not aligned", style="yellow"))
    if res.comparator:
        con.print(Text(f"cross-check: {res.comparator}"))
    if "repro" in res.files:
        con.print(Text(f"op-level repro: {res.files['repro']}"))
    con.print(Text(f"report: {directory / 'report.md'}"))
