"""`dsv4bisect diff-config A B`."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from dsv4bisect.cli.options import Disable, Enable, Json, Only, Set, overrides
from dsv4bisect.config.diff import Change, diff_configs
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.errors import ConfigError, ExitCode
from dsv4bisect.ui.console import stdout


def register(app: typer.Typer) -> None:
    app.command("diff-config")(diff_config)


def bisect_command(a: str, b: str, enable: list[str] | None, disable: list[str] | None,
                   only: str | None, sets: list[str] | None, changes: list[Change],
                   cfg_kind: str = "sglang") -> str | None:
    """The `bisect` command that searches what the diff shows (None: nothing differs). Two
    SGLang releases are an upgrade: the command bisects the switch defaults that changed."""
    if not changes:
        return None
    release = next((c for c in changes if c.section == "engine" and c.key == "release"),
                   None)
    if release is not None and cfg_kind == "sglang":
        return f"dsv4bisect bisect {shlex.quote(b)} --upgrade-from {release.a}"
    words = ["dsv4bisect", "bisect", "--good-config", a, "--bad-config", b]
    words += [w for name in enable or () for w in ("--enable", name)]
    words += [w for name in disable or () for w in ("--disable", name)]
    words += ["--only", only] if only is not None else []
    words += [w for item in sets or () for w in ("--set", item)]
    return " ".join(shlex.quote(w) for w in words)


def diff_config(
    a: Annotated[str, typer.Argument(help="Profile file, built-in name or run directory.")],
    b: Annotated[str, typer.Argument(help="Profile file, built-in name or run directory.")],
    json_out: Json = False,
    enable: Enable = None, disable: Disable = None, only: Only = None, sets: Set = None,
) -> None:
    """Compare two resolved configurations: patches, argv flag by flag, env, probe, fingerprint.

    --enable/--disable/--only/--set apply to B (a profile), so `diff-config P P --enable X`
    shows what X changes. When the process roles differ (one server against prefill, decode
    and a router) the engine processes are compared across roles. Exit 0 when identical, 1
    when they differ, 5 on bad input. Secrets are redacted.
    """
    from pathlib import Path

    from dsv4bisect.engines.load_any import load_config

    ov = overrides(enable, disable, only, sets)
    if ov != Overrides() and Path(b).is_dir():
        raise ConfigError(f"--enable/--disable/--only/--set apply to B, and {b} is a run "
                          "directory", "give B as a profile, or drop the overrides")
    cfg_a, cfg_b = load_config(a), load_config(b, ov)
    changes = diff_configs(cfg_a, cfg_b)
    command = bisect_command(a, b, enable, disable, only, sets, changes, cfg_b.kind)
    if json_out:
        print(json.dumps({"a": {"ref": a, "fingerprint": cfg_a.fingerprint},
                          "b": {"ref": b, "fingerprint": cfg_b.fingerprint},
                          "identical": not changes,
                          "changes": [asdict(c) for c in changes],
                          "bisect_command": command}, indent=2, default=str))
    elif not changes:
        stdout().print(f"identical (fingerprint {cfg_a.fingerprint})", markup=False)
    else:
        table = Table(title=f"{a}  →  {b}", title_justify="left")
        for column in ("section", "key", "A", "B"):
            table.add_column(column, overflow="fold")
        for c in changes:
            table.add_row(c.section, c.key, str(c.a), str(c.b))
        stdout().print(table)
        stdout().print(f"bisect these differences: {command}", markup=False, highlight=False,
                       soft_wrap=True)
    if changes:
        raise typer.Exit(int(ExitCode.FAIL))
