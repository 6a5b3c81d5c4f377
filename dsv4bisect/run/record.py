"""`run.json`: what was asked, with which versions, when, how long each stage took, how it ended.

Written when the run starts (`status: running`) and rewritten atomically as it ends (`done`,
`interrupted` or `error`), so a killed run still says what it was. Each write keeps RESERVE
bytes of blanks after the document: when the disk is full, no new file can be made for the
atomic rewrite, and the record's end is written over the file in place instead (its blocks
exist already), so a run the full disk stopped says `error`, not `running`. Schema
`dsv4bisect.run/1`:

    status            running | done | interrupted | error | abandoned (its process was killed:
                      found so by a later run on the same runs root, `reconcile_abandoned`)
    driver            {pid, start_time}: the dsv4bisect process that ran it (/proc/PID/stat)
    command           argv as typed (or as the caller passed it)
    profile, tier     the profile reference and the probe tier used
    overrides         {sets, enable, disable, only} of the candidate; good_overrides of the good end
    use_cache         false with --no-cache
    versions          {dsv4bisect, python, platform, probe_version, engine (the candidate's)}
    probe             {tier, spec_hash, seed_block, families, lengths}
    arms.<arm>        baseline | candidate: {profile, fingerprint, kind, patch_set, faults[],
                      inert[], attempts, launch_s[], crashes[], port_retries, cached (the cache
                      entry the baseline came from, or null)}
    aa                {repeat (bool), subset (a note, or null)}
    timing            {baseline_s, repeat_s, candidate_s, overlapped (A/A repeat beside the
                      candidate), report_s}
    started_at, finished_at, wall_s
    verdict, exit_code, error {message, hint} (on error), notes[]
                      (exit_code: the verdict's own code, or the error's; not the process's)
    exit              {warn_as, policy}: how the command maps that to the process exit
                      (`--warn-as`, `--exit-policy`); absent in a bisect trial's run
    arms.<arm>.verified  false when the answering server could not be checked to be the one
                      launched (a host that is not this machine); its baseline is not cached
    abandoned_at      when a later run found it `running` with its driver gone
"""

from __future__ import annotations

import errno
import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dsv4bisect
from dsv4bisect.base.bounded import load_json
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.engines import procfs
from dsv4bisect.engines.groups import identity
from dsv4bisect.base import atomic
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.spec import PROBE_VERSION, ProbeSpec
from dsv4bisect.redact import redact, secrets_in

RUN_SCHEMA = "dsv4bisect.run/1"
RUN_FILE = "run.json"
RESERVE = 8 * 1024  # blanks after the document: room for the end of a run on a full disk


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _overrides(ov: Overrides) -> dict[str, Any]:
    return {"sets": list(ov.sets), "enable": list(ov.enable), "disable": list(ov.disable),
            "only": None if ov.only is None else list(ov.only)}


def arm_summary(cfg: EngineConfig) -> dict[str, Any]:
    return {"profile": cfg.profile, "fingerprint": cfg.fingerprint, "kind": cfg.kind,
            "patch_set": cfg.patch_set,
            "faults": [p.name for p in cfg.patches if p.fault],
            "inert": [p.name for p in cfg.patches if p.inert],
            "attempts": 0, "launch_s": [], "crashes": [], "port_retries": 0, "cached": None,
            "verified": None}


@dataclass
class RunRecord:
    """The mutable document behind run.json; `save()` after every change that matters."""

    path: Path
    doc: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=time.perf_counter)
    # The A/A repeat's thread records its timing while the main thread records the candidate's.
    lock: threading.RLock = field(default_factory=threading.RLock)

    @classmethod
    def begin(cls, run_dir: Path, *, command: list[str], profile: str, overrides: Overrides,
              good_overrides: Overrides, use_cache: bool, spec: ProbeSpec,
              good: EngineConfig, candidate: EngineConfig) -> RunRecord:
        hidden = secrets_in([command, _overrides(overrides), _overrides(good_overrides)])
        doc = {
            "schema": RUN_SCHEMA, "status": "running", "driver": identity(),
            # run.json is shared and archived: the command and the override lists are stored
            # redacted (`--set engine.env.HF_TOKEN=…`); the configs a rerun needs are the
            # arms' config.json, which keep the real values.
            "command": redact(command, hidden), "profile": profile,
            "tier": spec.tier, "overrides": redact(_overrides(overrides), hidden),
            "good_overrides": redact(_overrides(good_overrides), hidden), "use_cache": use_cache,
            "versions": {"dsv4bisect": dsv4bisect.__version__, "python": sys.version.split()[0],
                         "platform": platform.platform(), "probe_version": PROBE_VERSION,
                         "engine": candidate.identity.get("engine_version")},
            "probe": {"tier": spec.tier, "spec_hash": spec.spec_hash(),
                      "seed_block": spec.seed_block, "families": list(spec.families),
                      "lengths": list(spec.lengths)},
            "arms": {"baseline": arm_summary(good), "candidate": arm_summary(candidate)},
            "aa": {"repeat": False, "subset": None},
            "timing": {"overlapped": False},
            "started_at": _now(), "finished_at": None, "wall_s": None,
            "verdict": None, "exit_code": None, "notes": [],
        }
        record = cls(run_dir / RUN_FILE, doc)
        record.save()
        return record

    def note(self, text: str) -> None:
        with self.lock:
            self.doc["notes"].append(text)

    def set(self, key: str, value: Any) -> None:
        with self.lock:
            self.doc[key] = value

    def arm(self, name: str) -> dict[str, Any]:
        with self.lock:
            return dict(self.doc["arms"][name])

    def update_arm(self, name: str, **fields: Any) -> None:
        with self.lock:
            self.doc["arms"][name].update(fields)

    def time(self, key: str, value: float | bool) -> None:
        with self.lock:
            self.doc["timing"][key] = round(value, 3) if not isinstance(value, bool) else value

    def finish(self, status: str, *, verdict: str | None = None, exit_code: int | None = None,
               error: tuple[str, str | None] | None = None) -> None:
        with self.lock:
            self.doc.update(status=status, finished_at=_now(),
                            wall_s=round(time.perf_counter() - self.t0, 3),
                            verdict=verdict, exit_code=exit_code)
            if error is not None:
                self.doc["error"] = {"message": error[0], "hint": error[1]}
            self.save()

    def save(self) -> None:
        with self.lock:
            write_record(self.path, self.doc)


def write_record(path: Path, doc: dict[str, Any]) -> None:
    """`doc` to `path` atomically, RESERVE blanks after it; on a full disk (no room for the
    new file), over the old file in place when the document fits in it."""
    text = json.dumps(doc, indent=2, default=str) + "\n"
    try:
        atomic.write_text(path, text + " " * RESERVE)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not _overwrite(path, text):
            raise


def _overwrite(path: Path, text: str) -> bool:
    """`text` over the file's first bytes, blanks after it to the old end; False when the
    file is too small (or gone). Not atomic: only for the disk-full case, where nothing is."""
    data = text.encode()
    try:
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if size < len(data):
                return False
            f.write(data + b" " * (size - len(data)))
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        return False
    return True


# run.json of a `run`, and of each trial of a bisect, under a runs root.
RECORD_PATTERNS = (f"*/{RUN_FILE}", f"*/trials/*/*/{RUN_FILE}")


def reconcile_abandoned(root: Path) -> list[Path]:
    """Mark `abandoned` every run under `root` still saying `running` whose driver (PID and
    start time) is gone — a `kill -9` or a lost machine; the run dirs changed. Only our own
    files (our uid), and only records that name their driver (older ones are left alone)."""
    changed = []
    for pattern in RECORD_PATTERNS:
        try:
            paths = sorted(root.glob(pattern))
        except OSError:
            continue
        for path in paths:
            try:
                if path.stat().st_uid != os.getuid():
                    continue
                doc = load_json(path, "run")
            except (OSError, ValueError, ConfigError):
                continue  # not a record we can read: not ours to reconcile
            if not isinstance(doc, dict) or doc.get("schema") != RUN_SCHEMA \
                    or doc.get("status") != "running" or not isinstance(doc.get("driver"), dict):
                continue
            driver = doc["driver"]
            if procfs.same_process(int(driver.get("pid") or 0), driver.get("start_time")):
                continue  # still running
            doc["status"] = "abandoned"
            doc["abandoned_at"] = _now()
            doc.setdefault("notes", []).append(
                f"abandoned: the process that ran it (PID {driver.get('pid')}) is gone (killed?);"
                " found by a later dsv4bisect on this runs root, which stopped its engines")
            try:
                write_record(path, doc)
            except OSError:
                continue
            changed.append(path.parent)
    return changed
