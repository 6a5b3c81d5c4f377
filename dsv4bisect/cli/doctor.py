"""`dsv4bisect doctor [PROFILE]`: what stands between this machine and a trial on SGLang."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from typing import Annotated, Optional

import typer
from rich.table import Table

from dsv4bisect.cli.options import Json
from dsv4bisect.errors import ConfigError, ExitCode
from dsv4bisect.ui.console import stdout


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    profile: Annotated[Optional[str], typer.Argument(
        help="Profile (file or built-in name); default: every built-in patch, no ports.")] = None,
    sglang_src: Annotated[Optional[str], typer.Option(
        "--sglang-src", metavar="PATH",
        help="Check hook targets statically in this SGLang source tree or wheel file.")] = None,
    python: Annotated[Optional[str], typer.Option(
        "--python", metavar="EXE", help="The engine's Python (default: the profile's).")] = None,
    json_out: Json = False,
) -> None:
    """Check SGLang, the plugin, every hook target, GPUs, forced env flags and ports.

    Exit 0 when all is well (warnings allowed), 1 when something must be fixed, 5 on bad input.
    """
    from dsv4bisect.patching.registry import builtin_patches
    from dsv4bisect.plugin import doctor as d

    patches, host, ports, engine_py = list(builtin_patches()), "127.0.0.1", [], None
    if profile is not None:
        from dsv4bisect.config.resolve import resolve

        cfg = resolve(profile)
        patches = [p.name for p in cfg.patches if p.builtin]
        host, ports = cfg.host, _fixed_ports(cfg)
        engine_py = next((p.argv[0] for p in cfg.processes if p.gets_patches), None)
    exe = _which(python or engine_py or sys.executable)
    try:
        src = d.source_tree(sglang_src)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc), "--sglang-src takes a directory holding sglang/ or a wheel")
    version = src.version() if src else d.sglang_version(exe)
    rows, layout = [], None
    first, layout = d.layout_check(version, str(src.root) if src else exe)
    rows.append(first)
    if src is None:
        rows.append(d.check_entry_point(exe))
    if layout is not None:
        declared = {n: dict(p.sglang.hooks) for n, p in builtin_patches().items()}
        rows += d.target_checks(d.all_targets(patches, layout, declared), layout, src, exe)
        if src is not None:
            rows += d.contract_checks(patches, layout, src)
    found, why = d.gpus()
    rows += d.gpu_checks(found, why, patches)
    rows += d.port_checks(host, ports)
    _render(rows, json_out)
    if any(r.status == d.FAIL for r in rows):
        raise typer.Exit(int(ExitCode.FAIL))


def _which(exe: str) -> str:
    return shutil.which(exe) or exe


def _fixed_ports(cfg) -> list[tuple[str, int]]:
    out = [(p.role, p.port) for p in cfg.processes if p.port is not None]
    for p in cfg.processes:  # the PD bootstrap port is an argument, not a process port
        argv = list(p.argv)
        if "--disaggregation-bootstrap-port" in argv:
            out.append((f"{p.role} bootstrap",
                        int(argv[argv.index("--disaggregation-bootstrap-port") + 1])))
    return out


def _render(rows, json_out: bool) -> None:
    if json_out:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return
    table = Table(title="dsv4bisect doctor", title_justify="left")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    style = {"ok": "green", "warn": "yellow", "fail": "bold red"}
    for r in rows:
        table.add_row(r.name, f"[{style[r.status]}]{r.status}[/]", r.detail, r.fix)
    stdout().print(table)
