"""What a killed predecessor left under a runs root: its engines, and its run.json.

Called at the start of `dsv4bisect run` and `dsv4bisect bisect` (fresh and `--resume`) on the
runs root they write into. Engines are stopped only when recorded in our own run directories and
matched by PID *and* start time, with their launcher gone (engines/groups.py); never found by
port or by name, which on a shared node could be a colleague's server.
"""

from __future__ import annotations

from pathlib import Path

from dsv4bisect.engines.groups import stop_orphans
from dsv4bisect.run.record import reconcile_abandoned


def clean_predecessors(root: Path) -> list[str]:
    """Stop orphaned engines and mark their runs abandoned; one sentence per thing done."""
    if not root.is_dir():
        return []
    said = [orphan.sentence() for orphan in stop_orphans(root)]
    said += [f"run {run_dir} was left `running` by a killed dsv4bisect: marked abandoned"
             for run_dir in reconcile_abandoned(root)]
    return said
