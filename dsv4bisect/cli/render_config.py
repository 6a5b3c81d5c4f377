"""Human rendering of a resolved engine configuration (stdout)."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table

from dsv4bisect.config.engine_config import EngineConfig


def render_engine_config(cfg: EngineConfig, out: Console) -> None:
    data = cfg.to_json()
    out.print(f"profile {cfg.profile}  kind {cfg.kind}  fingerprint {cfg.fingerprint}", markup=False)
    if cfg.cannot_start:
        out.print(f"CANNOT START: {cfg.cannot_start}", markup=False, style="bold red")
    table = Table(title="patches", title_justify="left")
    for column in ("patch", "state", "notes"):
        table.add_column(column)
    on = cfg.patch_set
    for choice in cfg.available:
        state = on.get(choice.name, "off")
        enabled = next((p for p in cfg.patches if p.name == choice.name), None)
        notes = [n for n in (
            "FAULT variant" if enabled and enabled.fault else "",
            f"inert: {(enabled or choice).inert}" if (enabled or choice).inert else "",
            f"required: {choice.required}" if choice.required else "",
            "" if choice.builtin else "custom",
        ) if n]
        table.add_row(choice.name, state, "; ".join(notes))
    out.print(table)
    for proc in data["processes"]:
        port = proc["port"] if proc["port"] is not None else "auto"
        gpus = ",".join(map(str, proc["gpus"])) or "-"
        out.print(f"\n[{proc['role']}] port {port}  gpus {gpus}  ready GET {proc['ready_path']}",
                  markup=False)
        out.print("  argv: " + shlex.join(proc["argv"]), markup=False, soft_wrap=True)
        for key, value in proc["env"].items():
            out.print(f"  env {key}={value}", markup=False)
