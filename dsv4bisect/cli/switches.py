"""`dsv4bisect switches [PROFILE] [--sglang-src WHEEL|DIR] [--engine vllm] [--json]`: the switches
an SGLang (docs/sglang.md, "Switch discovery") or vLLM (docs/vllm.md, "Switches") release reads
on DeepSeek-V4's path."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated, Any

import typer
from rich.table import Table

from dsv4bisect.base.versions import NEWEST_VERIFIED
from dsv4bisect.cli.options import Json
from dsv4bisect.errors import ConfigError
from dsv4bisect.patching.switch_catalog import Switch, SwitchCatalog, load_catalog
from dsv4bisect.ui.console import stdout


def register(app: typer.Typer) -> None:
    app.command("switches")(switches)


class EngineKind(str, Enum):
    sglang = "sglang"
    vllm = "vllm"


def switches(
    profile: Annotated[str | None, typer.Argument(
        help="Profile (file or built-in name): its engine, release and GPU architecture; "
             f"default: SGLang {NEWEST_VERIFIED} on sm120.")] = None,
    sglang_src: Annotated[str | None, typer.Option(
        "--sglang-src", metavar="WHEEL|DIR",
        help="Read the switches from this SGLang wheel or source tree (any release) instead "
             "of the data shipped for the verified ones.")] = None,
    engine: Annotated[EngineKind | None, typer.Option(
        help="Whose switches without a profile: sglang (default) or vllm.")] = None,
    release: Annotated[str | None, typer.Option(
        metavar="X.Y.Z", help="The release (default: the newest verified of the engine).")
    ] = None,
    vllm_src: Annotated[str | None, typer.Option(
        "--vllm-src", metavar="WHEEL|DIR",
        help="Read vLLM's switches from this wheel or source tree (any release).")] = None,
    json_out: Json = False,
) -> None:
    """List the env switches and server arguments SGLang (or vLLM) reads on DeepSeek-V4's path.

    Each with its type, default (per GPU architecture where the release makes it so), where
    it is read, when (import, construction, call), whether the plugin switches it in a running
    engine (hot: read per call and carried by a patch's switch), what it gates and its tier. Found statically (AST, no import); the data for the
    verified releases ships with dsv4bisect. Exit 0, 5 on bad input.
    """
    kind = _kind(profile) if profile is not None else (engine.value if engine else "sglang")
    if vllm_src is not None or kind == "vllm":
        from dsv4bisect.cli.switches_vllm import show_vllm

        show_vllm(profile, release, vllm_src, json_out)
        return
    if profile is not None and sglang_src is None and kind == "reference":
        from dsv4bisect.cli.switches_embedded import show_embedded

        show_embedded(json_out)  # the embedded engine's, read from its launcher
        return
    arch = "sm120"
    if profile is not None:
        release, arch = _release_of(profile)
    release = release or NEWEST_VERIFIED
    if sglang_src is not None:
        catalog = _discover(sglang_src)
    else:
        catalog = load_catalog(release)
    if json_out:
        print(json.dumps(catalog.to_json(), indent=1))
        return
    _table(catalog, arch)


def _kind(profile: str) -> str:
    from dsv4bisect.config.resolve import load_profile

    return load_profile(profile).profile.engine.kind


def _release_of(profile: str) -> tuple[str, str]:
    from dsv4bisect.config.resolve import load_profile

    engine = load_profile(profile).profile.engine
    if engine.kind != "sglang":
        raise ConfigError(f"profile {profile} runs the {engine.kind} engine, not SGLang",
                          "give an SGLang profile, e.g. dsv4bisect switches "
                          "dsv4-flash-tp8-latest")
    if not engine.sglang_version:
        raise ConfigError(f"profile {profile} names no SGLang release (engine.sglang_version)",
                          "set engine.sglang_version, or give --sglang-src WHEEL|DIR")
    return engine.sglang_version, engine.gpu_arch or "sm120"


def _discover(path: str) -> SwitchCatalog:
    import zipfile
    from pathlib import Path

    from dsv4bisect.plugin.discover import discover
    from dsv4bisect.plugin.static import SourceTree

    try:
        src = SourceTree(Path(path))
    except FileNotFoundError as exc:
        raise ConfigError(str(exc), "--sglang-src takes a directory holding sglang/ or a wheel")
    except (OSError, zipfile.BadZipFile) as exc:  # unreadable, or a file that is no wheel
        raise ConfigError(f"cannot read {path}: {exc}",
                          "--sglang-src takes a directory holding sglang/ or a wheel") from exc
    if src.text("sglang/srt/environ.py") is None and \
            not any(f.startswith("sglang/srt/") for f in src.py_files()):
        raise ConfigError(f"{path} holds no SGLang source (no sglang/srt/)",
                          "--sglang-src takes a directory holding sglang/ or a wheel")
    return discover(src)


def _default(switch: Switch, arch: str) -> str:
    value: Any = switch.default_for(arch)
    text = "-" if value is None else json.dumps(value) if not isinstance(value, str) else value
    if arch in switch.forced:
        text += " (forced)"
    elif isinstance(switch.default, dict) and arch in switch.default:
        text += f" (on {arch})"
    return text


def _table(catalog: SwitchCatalog, arch: str) -> None:
    table = Table(title=f"SGLang {catalog.release}: {catalog.count('env')} env switches and "
                        f"{catalog.count('arg')} server arguments on DeepSeek-V4's path "
                        f"(defaults on {arch})", title_justify="left")
    for column in ("switch", "type", "default", "read", "hot", "tier", "gates", "where"):
        table.add_column(column, overflow="fold")
    for s in catalog.switches:
        short = s.type if len(s.type) <= 24 else s.type[:23] + "…"  # Literal[...] choices
        table.add_row(s.name, short, _default(s, arch), s.read, "yes" if s.hot else "",
                      s.tier, s.gates, s.where)
    stdout().print(table)
