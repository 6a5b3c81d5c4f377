"""`dsv4bisect microtest [PATCH...]`: each patch's op against its fp32 reference on real weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dsv4bisect.ui.console import console
from dsv4bisect.base.unique_dir import make_unique_dir

if TYPE_CHECKING:
    from rich.table import Table

    from dsv4bisect.microtest.results import MicrotestReport, Row

_STYLE = {"ok": "green", "FAIL": "bold red", "info": "dim", "fault": "yellow",
          "fault-ok": "yellow", "contrast": "yellow", "contrast-ok": "dim"}
_LIVE_ROWS = 18  # rows kept in the live view; the full table follows at the end


def register(app: typer.Typer) -> None:
    app.command("microtest")(microtest)


def microtest(
    patches: Annotated[list[str] | None, typer.Argument(
        metavar="[PATCH[:VARIANT]]...", help="Patches to test (default: all six).")] = None,
    checkpoint: Annotated[str, typer.Option(
        metavar="embedded|random|DIR", help="`embedded` (shipped checkpoint), `random` (seed-0 "
        "random tiny model) or a DeepSeek-V4 checkpoint directory.")] = "embedded",
    layers: Annotated[str, typer.Option(
        metavar="SPEC", help="Layers: numbers, ranges and kinds (0,2-4, csa, hca, swa, hash, "
        "last, all); `auto`: the first of each kind, the first score-routed and the last.")
    ] = "auto",
    contexts: Annotated[str, typer.Option(
        metavar="LIST", help="Context lengths for mma-decode and triton-indexer.")
    ] = "1k,8k,32k,128k",
    device: Annotated[str, typer.Option(
        metavar="cpu|cuda", help="cuda runs the patched ops with the Triton kernels.")] = "cpu",
    activations: Annotated[Path | None, typer.Option(
        metavar="FILE", help="Captured activations (safetensors, see docs/microtest.md); "
        "default: synthetic at the scale of the real norms.")] = None,
    moe_backend: Annotated[list[str] | None, typer.Option(
        "--moe-backend", metavar="NAME", help="Runner choices for hash-topk-scaling "
        "(repeatable; default triton, marlin, flashinfer_trtllm_routed, flashinfer_cutlass).")
    ] = None,
    profile: Annotated[str, typer.Option(
        metavar="PROFILE", help="The configuration the counted rows concern: its MoE runner "
        "(other runners' rows are shown for contrast, not counted, unless --moe-backend names "
        "them).")] = "reference-all",
    tokens: Annotated[int, typer.Option(min=1, help="Rows (queries, tokens) per check.")] = 32,
    experts: Annotated[int, typer.Option(min=1, help="Routed experts sampled per layer.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic activations.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON on stdout.")
                        ] = False,
    out: Annotated[Path | None, typer.Option(
        metavar="DIR", help="Run directory for microtest.md / .json (default "
        "runs/microtest-<UTC time>-<random>).")] = None,
) -> None:
    """Test each patch's op against its fp32 reference on a checkpoint's real tensors.

    Reads only the named tensors of the chosen layers. Exit codes: 0 every counted figure within
    its tolerance, 1 otherwise, 5 bad input (e.g. missing tensors, which are named).
    """
    from dsv4bisect.microtest.run import run_microtest, write_report
    from dsv4bisect.microtest.runners import RUNNER_CHOICES
    from dsv4bisect.microtest.spec import MicrotestSpec, parse_contexts, parse_patches

    deployed = None if moe_backend else _profile_runner(profile)
    spec = MicrotestSpec(
        patches=parse_patches(patches or []), checkpoint=checkpoint, layers=layers,
        contexts=parse_contexts(contexts), device=device,
        activations=None if activations is None else str(activations),
        runners=tuple(moe_backend) if moe_backend else RUNNER_CHOICES, tokens=tokens,
        experts=experts, seed=seed, deployed_runner=deployed)
    with _LiveTable() as live:
        report = run_microtest(spec, on_row=live.add)
    out_dir = out or make_unique_dir(Path("runs"), "microtest")
    md = write_report(report, out_dir)
    _summary(report, md, profile if deployed else None)
    if json_out:
        print(json.dumps(report.to_dict(), indent=2))
    raise typer.Exit(report.exit_code)


def _profile_runner(profile: str) -> str | None:
    """The MoE runner `profile` deploys, if it is one the microtest measures."""
    from dsv4bisect.config.resolve import Overrides, load_profile
    from dsv4bisect.microtest.runners import RUNNER_CHOICES

    backend = load_profile(profile, Overrides()).profile.engine.moe_backend
    return backend if backend in RUNNER_CHOICES else None


def _table(rows: list[Row], title: str | None = None) -> Table:
    from rich.table import Table
    from rich.text import Text

    from dsv4bisect.microtest.markdown import format_tolerance, format_value, note_text
    from dsv4bisect.microtest.results import layer_ranges

    table = Table(title=title, title_justify="left", header_style="bold")
    for col in ("patch", "layers", "case", "value", "tolerance", "status", "note"):
        table.add_column(col, overflow="fold", justify="right" if col == "value" else "left")
    for r in rows:
        cells = (r.patch, layer_ranges(r.layers), r.case, format_value(r), format_tolerance(r),
                 r.status, note_text(r))
        table.add_row(*(Text(c) for c in cells), style=_STYLE[r.status])  # no markup in notes
    return table


class _LiveTable:
    """The rows as they arrive, as a Rich table on stderr (a terminal only)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self._live = None

    def __enter__(self) -> _LiveTable:
        from rich.live import Live

        con = console()
        if con.is_terminal:
            self._live = Live(_table([]), console=con, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def add(self, row: Row) -> None:
        self.rows.append(row)
        if self._live is not None:
            failing = sum(r.status == "FAIL" for r in self.rows)
            title = f"microtest: {len(self.rows)} rows, {failing} outside tolerance"
            self._live.update(_table(self.rows[-_LIVE_ROWS:], title))

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)  # type: ignore[arg-type]


def _summary(report: MicrotestReport, md: Path, profile: str | None) -> None:
    con = console()
    con.print(_table(list(report.rows), f"microtest: {report.setup.get('checkpoint')}"))
    from dsv4bisect.microtest.markdown import fault_legend

    legend = fault_legend(report.rows)
    if legend:
        con.print(legend, style="dim", markup=False, highlight=False)
    verdict = "FAIL" if report.failed else "PASS"
    counted = [r for r in report.rows if not r.contrast]
    whose = f" of {profile}'s configuration" if profile else ""
    contrast = report.contrast_outside
    also = (f" (and {len(contrast)} contrast rows of other configurations outside, not "
            "counted)") if contrast else ""
    con.print(f"{verdict}: {len(report.failed)} of {len(counted)} rows{whose} outside "
              f"tolerance{also} | {report.tensors_read} tensors read | {report.seconds:.1f}s | "
              f"{md}", style="bold red" if report.failed else "bold green", markup=False)
