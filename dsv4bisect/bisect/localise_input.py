"""What `localise BISECT_DIR` reads from a finished bisect: its profile and `--set`s, the bad end's
patch set, the culprit set it found, and where the probe runs of the bad end (and of the trials
that had the culprit) and of the good end lie — the cases that lost facts are among them.

Read only (the ledger is opened read-only, nothing is written). A bisect that found no culprit
has nothing to localise: `error:` + `hint:` (exit 5). `localise_command` is the line a finished
bisect prints next (here, not in `localise/`: reading a bisect is the bisect layer's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsv4bisect.bisect.driver import read_run_file
from dsv4bisect.bisect.ledger import open_holding
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.errors import BisectError, Dsv4BisectError
from dsv4bisect.localise.command import bisect_command, shell
from dsv4bisect.localise.driver import BisectInput, Question, resolve_ends


def _moved(path: Path, recorded_root: Path, root: Path) -> Path:
    """A path the bisect recorded under its run directory, under the directory being read
    when that was copied or moved elsewhere (its own copy first)."""
    if recorded_root == root:
        return path
    try:
        moved = root / path.relative_to(recorded_root)
    except ValueError:
        return path
    return moved if moved.exists() or not path.exists() else path


def _read_run(root: Path, recorded: Path, run_id: str) -> tuple[Any, list[Any]]:
    """The run and its trials, from the ledger that holds it (`open_holding`)."""
    with open_holding(root, recorded, run_id) as ledger:
        run = ledger.get_run(run_id)
        return run, ledger.trials(run.id)


def read_bisect(run_dir: str | Path) -> BisectInput:
    root = Path(run_dir).resolve()
    info = read_run_file(root)
    request = dict(info.get("request") or {})
    run, trials = _read_run(root, Path(info["ledger"]), info["run_id"])
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


def localise_command(run_dir: str | Path) -> str | None:
    """The `dsv4bisect localise RUN_DIR` line to run after a bisect in `run_dir` finished, as a
    shell takes it back (`run_dir` as given); None where `localise` cannot take it: no FOUND
    culprit, a test command's or two configuration files' bisect (no profile), or ends that
    `localise` refuses (a PD or vLLM profile, a culprit that changes nothing, an end that cannot
    start). Resolves both ends (torch-free, no launch), as `localise RUN_DIR` would first."""
    try:
        resolve_ends(Question(bisect=read_bisect(run_dir)))
    except Dsv4BisectError:
        return None
    return shell(bisect_command(run_dir))
