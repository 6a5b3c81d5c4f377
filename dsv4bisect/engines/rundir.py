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

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dsv4bisect.config.bounded import load_json
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.errors import ConfigError

CONFIG_FILE = "config.json"


def new_run_dir(root: Path, profile: str, fingerprint: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = root / f"{stamp}-{profile}-{fingerprint[:8]}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = root / f"{stamp}-{profile}-{fingerprint[:8]}-{suffix}"
    path.mkdir(parents=True)
    return path


def write_json(path: Path, data: Any) -> None:
    """Atomic write: a reader never sees half a file, a crash never leaves one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def save_config(arm_dir: Path, cfg: EngineConfig) -> None:
    write_json(arm_dir / CONFIG_FILE, cfg.to_json(redact=False))


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
