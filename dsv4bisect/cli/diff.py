"""`dsv4bisect diff-config A B`."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from dsv4bisect.cli.options import Json
from dsv4bisect.config.diff import diff_configs
from dsv4bisect.errors import ExitCode
from dsv4bisect.ui.console import stdout


def register(app: typer.Typer) -> None:
    app.command("diff-config")(diff_config)


def diff_config(
    a: Annotated[str, typer.Argument(help="Profile file, built-in name or run directory.")],
    b: Annotated[str, typer.Argument(help="Profile file, built-in name or run directory.")],
    json_out: Json = False,
) -> None:
    """Compare two resolved configurations: patches, argv flag by flag, env, probe, fingerprint.

    Exit 0 when identical, 1 when they differ, 5 on bad input. Secrets are redacted.
    """
    from dsv4bisect.config.load_any import load_config

    cfg_a, cfg_b = load_config(a), load_config(b)
    changes = diff_configs(cfg_a, cfg_b)
    if json_out:
        print(json.dumps({"a": {"ref": a, "fingerprint": cfg_a.fingerprint},
                          "b": {"ref": b, "fingerprint": cfg_b.fingerprint},
                          "identical": not changes,
                          "changes": [asdict(c) for c in changes]}, indent=2, default=str))
    elif not changes:
        stdout().print(f"identical (fingerprint {cfg_a.fingerprint})", markup=False)
    else:
        table = Table(title=f"{a}  →  {b}", title_justify="left")
        for column in ("section", "key", "A", "B"):
            table.add_column(column, overflow="fold")
        for c in changes:
            table.add_row(c.section, c.key, str(c.a), str(c.b))
        stdout().print(table)
    if changes:
        raise typer.Exit(int(ExitCode.FAIL))
