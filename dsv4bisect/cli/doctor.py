"""`dsv4bisect doctor [PROFILE]`: what stands between this machine and a trial on SGLang."""

from __future__ import annotations

import json
import shutil
import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from dsv4bisect.cli.options import Disable, Enable, Json, Only, Set, overrides
from dsv4bisect.errors import ConfigError, ExitCode
from dsv4bisect.ui.console import stdout

if TYPE_CHECKING:
    from dsv4bisect.config.engine_config import EngineConfig
    from dsv4bisect.config.resolve import LoadedProfile
    from dsv4bisect.engines.finding import Finding


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    profile: Annotated[Optional[str], typer.Argument(
        help="Profile (file or built-in name); default: what `run` runs (reference-all), or "
             "with --sglang-src every built-in patch's SGLang targets.")] = None,
    sglang_src: Annotated[Optional[str], typer.Option(
        "--sglang-src", metavar="PATH",
        help="Check hook targets statically in this SGLang source tree or wheel file.")] = None,
    python: Annotated[Optional[str], typer.Option(
        "--python", metavar="EXE", help="The engine's Python (default: the profile's).")] = None,
    allow_unverified: Annotated[bool, typer.Option(
        "--allow-unverified-sglang",
        help="Warn instead of failing on an SGLang release dsv4bisect has not verified.")] = False,
    vllm_src: Annotated[Optional[str], typer.Option(
        "--vllm-src", metavar="PATH",
        help="kind: vllm: read the release's facts from this vLLM wheel or source tree.")] = None,
    allow_unverified_vllm: Annotated[bool, typer.Option(
        "--allow-unverified-vllm",
        help="kind: vllm: warn instead of failing on an unverified vLLM release.")] = False,
    json_out: Json = False,
    enable: Enable = None, disable: Disable = None, only: Only = None, sets: Set = None,
) -> None:
    """Check SGLang, the plugin, every hook target, GPUs, forced env flags and ports.

    For an embedded-engine profile (`kind: reference`) it checks that engine instead: its
    Python runs, torch imports there, the checkpoint loads; no SGLang or GPU rows. With no
    profile it checks what `dsv4bisect run` would run (reference-all, the embedded engine);
    with --sglang-src and no profile, every built-in patch's hook targets in that tree.

    The SGLang row says whether the release is one dsv4bisect verified (0.5.13 to 0.5.23); an
    unverified one (newer, or a dev build) is checked statically and then refused with one
    line, unless --allow-unverified-sglang (or the profile's engine.allow_unverified_sglang).
    Exit 0 when all is well (warnings allowed), 1 when something must be fixed, 5 on bad input.
    """
    from dsv4bisect.engines import preflight as d
    from dsv4bisect.patching.registry import builtin_patches

    patches, host, ports, engine_py = list(builtin_patches()), "127.0.0.1", [], None
    if profile is None and sglang_src is None:  # what `run` and `bisect` take by default
        from dsv4bisect.config.resolve import DEFAULT_PROFILE

        profile = DEFAULT_PROFILE
    if profile is not None:
        from dsv4bisect.config.resolve import load_profile, resolve_loaded

        loaded = load_profile(profile, overrides(enable, disable, only, sets))
        cfg = resolve_loaded(loaded)
        patches = [p.name for p in cfg.patches if p.builtin and p.delivered]
        allow_unverified = allow_unverified or loaded.profile.engine.allow_unverified_sglang
        host, ports = cfg.host, d.fixed_ports(cfg)
        if any(p.gets_patches for p in cfg.processes):  # `{python}` as the launcher runs it
            engine_py = d.engine_python(cfg)
        if cfg.kind == "vllm":
            _vllm(loaded, cfg, python or engine_py or sys.executable, vllm_src,
                  allow_unverified_vllm, json_out)
            return
        if cfg.kind == "reference":
            ref = loaded.profile.engine.reference
            rows = d.embedded_checks(_which(python or engine_py or sys.executable),
                                     ref.checkpoint if ref else "embedded",
                                     ref.device if ref else "auto")
            rows += d.port_checks(host, ports)
            _render(rows, json_out)
            if any(r.failed for r in rows):
                raise typer.Exit(int(ExitCode.FAIL))
            return
    elif enable or disable or only or sets:
        raise ConfigError("--enable/--disable/--only/--set with --sglang-src need a PROFILE",
                          "e.g. dsv4bisect doctor dsv4-flash-tp8 --sglang-src PATH "
                          "--enable mma-decode")
    exe = _which(python or engine_py or sys.executable)
    try:
        src = d.source_tree(sglang_src)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc), "--sglang-src takes a directory holding sglang/ or a wheel")
    version = src.version() if src else d.sglang_version(exe)
    if src is not None and version is None:
        version = "0.0.0.dev0"  # a checkout with no version file: what setuptools-scm would say
    rows = []
    first, layout, info = d.layout_check(version, str(src.root) if src else exe,
                                         allow_unverified)
    rows.append(first)
    if src is None:
        rows.append(d.check_entry_point(exe))
    if layout is not None:
        rows += d.target_checks(d.all_targets(patches, layout, builtin_patches()), layout, src,
                                exe)
        readable = src or (d.installed_source(exe) if version else None)
        if readable is not None:
            rows += d.contract_checks(patches, layout, readable, builtin_patches())
        rows.append(d.forced_flags_check(readable, version))
    found, why = d.gpus()
    rows += d.gpu_checks(found, why, patches)
    rows += d.port_checks(host, ports)
    # The preflight's checks doctor has no row for (model, GPUs free, ...): about this node, so
    # not with --sglang-src (a static check of a tree, usually off the node).
    if profile is not None and sglang_src is None:
        rows += d.doctor_rows(loaded, cfg, python)
    _render(rows, json_out)
    if info is not None and not info.verified and info.layout is None:
        print(f"error: {info.reason}", file=sys.stderr)  # the one-line refusal
    if any(r.failed for r in rows):
        raise typer.Exit(int(ExitCode.FAIL))


def _vllm(loaded: LoadedProfile, cfg: EngineConfig, python: str, src: Optional[str],
          allow: bool, json_out: bool) -> None:
    """A `kind: vllm` profile: vLLM, the plugin, the argv, every hook target (docs/vllm.md)."""
    from dsv4bisect.base.vllm_releases import refusal_hint
    from dsv4bisect.engines import preflight as d
    from dsv4bisect.engines.vllm_checks import doctor as vllm_doctor
    from dsv4bisect.engines.vllm_checks import gpu_rows

    engine = loaded.profile.engine
    try:
        rows, info = vllm_doctor(cfg, _which(python), engine.vllm_version,
                                 allow or engine.allow_unverified_vllm, src)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc), "--vllm-src takes a vLLM wheel or a directory holding vllm/")
    found, why = d.gpus()
    rows += gpu_rows(found, why, [p.name for p in cfg.patches if p.builtin and p.delivered])
    rows += d.port_checks(cfg.host, d.fixed_ports(cfg))
    if src is None:
        rows += [r for r in d.doctor_rows(loaded, cfg, python)
                 if r.check in ("preflight: model", "preflight: GPUs")]
    _render(rows, json_out)
    if info is not None and info.layout is None:
        print(f"error: {info.reason}\nhint: {refusal_hint(info)}", file=sys.stderr)
    if any(r.failed for r in rows):
        raise typer.Exit(int(ExitCode.FAIL))


def _which(exe: str) -> str:
    return shutil.which(exe) or exe


def _render(rows: list[Finding], json_out: bool) -> None:
    if json_out:  # doctor's own keys: a row's name and its fix
        print(json.dumps([{"name": r.check, "status": r.status, "detail": r.detail,
                           "fix": r.hint} for r in rows], indent=2))
        return
    table = Table(title="dsv4bisect doctor", title_justify="left")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    style = {"ok": "green", "warn": "yellow", "fail": "bold red"}
    for r in rows:
        table.add_row(r.check, f"[{style[r.status]}]{r.status}[/]", r.detail, r.hint)
    stdout().print(table)
