"""Run directories: where a run or bisect keeps its resolved configs, logs, receipts and results.

Layout of `dsv4bisect run` (DESIGN §9; docs/run.md):
    <run>/run.json                 what was asked (profile, overrides, tier), versions, when,
                                   status, timing per stage, wall time (dsv4bisect/run/record.py)
    <run>/<arm>/config.json        resolved EngineConfig of each arm (baseline, candidate)
    <run>/<arm>/logs/<role>.log    one log per engine process (secrets redacted); a relaunch
                                   after a crash appends to it below a `--- dsv4bisect:` line
    <run>/<arm>/receipts/          receipts written by engine processes (receipts-attemptN/:
                                   those of a launch that crashed)
    <run>/<arm>/run.json, cases.jsonl, rows.jsonl, drift.jsonl
                                   the arm's probe run (`ProbeRun.save`)
    <run>/baseline-repeat/         the A/A repeat's probe run (same engine as baseline/)
    <run>/verdict.json, report.md, heatmap.png
A reused baseline is copied in from the cache with the logs of the launch that measured it;
`<run>/baseline` is a saved baseline for `dsv4bisect probe URL --baseline <run>/baseline`.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dsv4bisect.base import atomic
from dsv4bisect.base.bounded import load_json
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.errors import ConfigError, Dsv4BisectError

CONFIG_FILE = "config.json"


class RunsRootError(Dsv4BisectError):
    """`--out` cannot hold run directories (exit 5, bad input)."""


def ensure_runs_root(root: Path, option: str = "--out") -> Path:
    """`root` as a directory we can write run directories into, created if missing — but only
    its last component: a missing parent is more likely a typo than a wish (`mkdir`, not
    `mkdir -p`). Writability is tried with a real file, so a read-only mount is caught for root
    too. Every failure is one `error:` line with a `hint:`."""
    hint = f"pass {option} a writable directory (it is created if only its last part is missing)"
    if root.exists() and not root.is_dir():
        raise RunsRootError(f"{option} {root} is not a directory", hint)
    if not root.exists():
        parent = root.absolute().parent
        if not parent.is_dir():
            raise RunsRootError(
                f"{option} {root}: its parent {parent} does not exist (or is not a directory)",
                f"create {parent} first, or pass {option} another directory")
        try:
            root.mkdir()
        except FileExistsError:
            pass  # a concurrent run made it
        except OSError as exc:
            raise RunsRootError(f"{option} {root} cannot be created: {exc.strerror}",
                                hint) from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=root)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise RunsRootError(f"{option} {root} is not writable: {exc.strerror}", hint) from None
    return root


def new_run_dir(root: Path, profile: str, fingerprint: str) -> Path:
    """A new run directory; an exclusive `mkdir`, so two runs started in the same second with
    the same profile take `…-2`, `…-3` instead of sharing one."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = root / f"{stamp}-{profile}-{fingerprint[:8]}"
    for suffix in range(1, 1000):
        path = base if suffix == 1 else base.with_name(f"{base.name}-{suffix}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as exc:  # a runs root that went read-only or full since it was checked
            raise RunsRootError(f"cannot create the run directory {path}: {exc.strerror}",
                                "free space, or pass --out a writable directory") from None
    raise RunsRootError(f"no unused run directory name under {root} for {base.name}",
                        "pass --out another runs root")


def write_json(path: Path, data: Any) -> None:
    """A run directory's JSON (values JSON cannot hold written as text), atomically."""
    atomic.write_json(path, data, default=str)


def save_config(arm_dir: Path, cfg: EngineConfig) -> None:
    """The arm's config unredacted (what a rerun and `diff-config RUN_DIR` rebuild from):
    readable by its owner only."""
    atomic.write_json(arm_dir / CONFIG_FILE, cfg.to_json(redact=False), default=str,
                      private=True)


def load_run_config(path: Path, arm: str = "candidate") -> EngineConfig:
    """The resolved config of a run directory (its candidate arm) or of one arm directory."""
    for candidate in (path / CONFIG_FILE, path / arm / CONFIG_FILE):
        if candidate.is_file():
            try:
                return EngineConfig.from_json(load_json(candidate, "run"))  # bounded read
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ConfigError(f"{candidate}: not a dsv4bisect config ({exc})",
                                  "was it written by another version?") from exc
    raise ConfigError(f"{path} is a directory without {CONFIG_FILE}",
                      "give a run directory written by `dsv4bisect run`, a profile or a name")
