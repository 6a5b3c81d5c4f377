"""`dsv4bisect switches --engine vllm` (or a vLLM profile): vLLM's env switches and config
settings on DeepSeek-V4's path, per release (docs/vllm.md, "Switches")."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from rich.table import Table

from dsv4bisect.base.vllm_releases import NEWEST_VERIFIED
from dsv4bisect.errors import ConfigError
from dsv4bisect.patching.switch_catalog import SwitchCatalog, load_catalog
from dsv4bisect.ui.console import stdout


def show_vllm(profile: str | None, release: str | None, src: str | None,
              json_out: bool) -> None:
    if src is not None:
        catalog = _discover(src)
    else:
        catalog = load_catalog(release or _release_of(profile) or NEWEST_VERIFIED, "vllm")
    if json_out:
        print(json.dumps(catalog.to_json(), indent=1))
        return
    _table(catalog)


def _release_of(profile: str | None) -> str | None:
    if profile is None:
        return None
    from dsv4bisect.config.resolve import load_profile

    engine = load_profile(profile).profile.engine
    if engine.kind != "vllm":
        raise ConfigError(f"profile {profile} runs the {engine.kind} engine, not vLLM",
                          "give a vLLM profile, e.g. dsv4bisect switches dsv4-flash-vllm-tp8")
    return engine.vllm_version


def _discover(path: str) -> SwitchCatalog:
    from dsv4bisect.plugin.vllm.discover import discover
    from dsv4bisect.plugin.vllm.tree import open_tree

    hint = "--vllm-src takes a vLLM wheel or a directory holding vllm/"
    try:
        tree = open_tree(Path(path))
    except FileNotFoundError as exc:
        raise ConfigError(str(exc), hint) from exc
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", hint) from exc
    return discover(tree)


def _table(catalog: SwitchCatalog) -> None:
    table = Table(title=f"vLLM {catalog.release}: {catalog.count('env')} env switches and "
                        f"{catalog.count('arg')} config settings on DeepSeek-V4's path "
                        "(every one needs a fresh launch)", title_justify="left")
    for column in ("switch", "type", "default", "read", "tier", "gates", "where"):
        table.add_column(column, overflow="fold")
    for s in catalog.switches:
        default = "-" if s.default is None else s.default if isinstance(s.default, str) \
            else json.dumps(s.default)
        name = s.name + (f" (was {', '.join(s.replaces)})" if s.replaces else "")
        table.add_row(name, s.type, default, s.read, s.tier, s.gates, s.where)
    stdout().print(table)
