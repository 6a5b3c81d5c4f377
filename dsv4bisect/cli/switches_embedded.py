"""`dsv4bisect switches reference`: the embedded engine's switches (config/embedded_switches.py),
in the SGLang catalog's JSON schema with release "embedded"."""

from __future__ import annotations

import json
from dataclasses import asdict

from rich.table import Table

from dsv4bisect.config.embedded_switches import RELEASE, embedded_catalog
from dsv4bisect.ui.console import stdout


def show_embedded(json_out: bool) -> None:
    switches = embedded_catalog()
    if json_out:
        print(json.dumps({"release": RELEASE, "switches": [asdict(s) for s in switches]},
                         indent=1, default=str))
        return
    table = Table(title=f"The embedded engine: {len(switches)} switches (profile keys its "
                        "launcher passes to `dsv4bisect serve`, and the patches)",
                  title_justify="left")
    for column in ("switch", "kind", "type", "default", "read", "hot", "tier", "gates"):
        table.add_column(column, overflow="fold")
    for s in switches:
        table.add_row(s.name, s.kind, s.type, str(s.default), s.read, "yes" if s.hot else "",
                      s.tier, s.gates)
    stdout().print(table)
