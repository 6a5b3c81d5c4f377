"""What `localise BISECT_DIR` reads from a finished bisect: its profile and `--set`s, the bad end's
patch set, the culprit set it found, and where the probe runs of the bad end (and of the trials
that had the culprit) and of the good end lie — the cases that lost facts are among them.

Read only (the ledger is opened read-only, nothing is written). A bisect that found no culprit
has nothing to localise: `error:` + `hint:` (exit 5).
"""

from __future__ import annotations

from pathlib import Path

from dsv4bisect.bisect.driver import read_run_file
from dsv4bisect.bisect.ledger import Ledger
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.errors import BisectError
from dsv4bisect.localise.driver import BisectInput


def _moved(path: Path, recorded_root: Path, root: Path) -> Path:
    """A path the bisect recorded under its run directory, where that directory is now (a runs
    root copied or moved elsewhere keeps its layout)."""
    if path.exists() or recorded_root == root:
        return path
    try:
        return root / path.relative_to(recorded_root)
    except ValueError:
        return path


def read_bisect(run_dir: str | Path) -> BisectInput:
    root = Path(run_dir).resolve()
    info = read_run_file(root)
    request = dict(info.get("request") or {})
    ledger_path = Path(info["ledger"])
    if not ledger_path.is_file() and (root.parent / ledger_path.name).is_file():
        ledger_path = root.parent / ledger_path.name  # the runs root moved with it
    with Ledger.open_readonly(ledger_path) as ledger:
        run = ledger.get_run(info["run_id"])
        trials = ledger.trials(run.id)
    recorded = Path(run.run_dir)
    spec = BisectSpec.from_json(run.settings)
    result = run.result or {}
    culprits = result.get("culprits")
    if result.get("status") != "found" or not culprits:
        raise BisectError(f"the bisect in `{root}` named no culprit "
                          f"(status {result.get('status') or run.status})",
                          "localise a bisect that said FOUND, or localise the profile with "
                          "--only / --culprit")
    profile = request.get("profile")
    if not profile:
        raise BisectError(f"the bisect in `{root}` ran a test command, not a profile",
                          "localise needs the configurations: localise the profile instead")
    bad = dict(spec.bad)
    with_culprit = [_moved(Path(t.trial_dir), recorded, root) for t in trials
                    if t.trial_dir and all(t.patches.get(c) == bad.get(c) for c in culprits)]
    dirs = [d for d in (root / "ends", *with_culprit) if d.is_dir()]
    return BisectInput(run_dir=root, profile=str(profile),
                       sets=tuple(request.get("sets") or ()), bad_patches=bad,
                       culprit=tuple(sorted(culprits)), tier=request.get("tier"),
                       probe_dirs=tuple(dirs))
