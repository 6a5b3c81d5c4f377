"""Run records of killed runs, and the rule that only a verified good end is cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bisect.config.resolve import Overrides
from dsv4bisect.engines import procfs
from dsv4bisect.engines.groups import identity
from dsv4bisect.run import baseline as cache
from dsv4bisect.run.arm import EngineArm, Supervisor
from dsv4bisect.run.ends import probe_spec, resolve_ends
from dsv4bisect.run.events import ignore
from dsv4bisect.run.record import RUN_SCHEMA, RunRecord, reconcile_abandoned
from dsv4bisect.run.trial import Trial

pytestmark = pytest.mark.skipif(not procfs.available(), reason="needs Linux /proc")


def _dead_identity() -> dict[str, object]:
    """The PID and start time of a real process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    who = identity(proc.pid)
    proc.communicate(b"")
    return who


def _run_json(path: Path, status: str, driver: dict[str, object] | None) -> Path:
    path.mkdir(parents=True)
    doc = {"schema": RUN_SCHEMA, "status": status, "notes": []}
    if driver is not None:
        doc["driver"] = driver
    (path / "run.json").write_text(json.dumps(doc))
    return path


def test_a_running_record_whose_driver_is_gone_becomes_abandoned(tmp_path: Path) -> None:
    dead = _dead_identity()
    killed = _run_json(tmp_path / "killed", "running", dead)
    trial = _run_json(tmp_path / "bis" / "trials" / "001-x" / "run", "running", dead)
    live = _run_json(tmp_path / "live", "running", identity())  # this process: still running
    done = _run_json(tmp_path / "done", "done", dead)
    old = _run_json(tmp_path / "old", "running", None)  # no driver recorded: cannot tell

    assert sorted(reconcile_abandoned(tmp_path)) == sorted([killed, trial])
    doc = json.loads((killed / "run.json").read_text())
    assert doc["status"] == "abandoned" and doc["abandoned_at"] and "gone" in doc["notes"][-1]
    for path, status in ((live, "running"), (done, "done"), (old, "running")):
        assert json.loads((path / "run.json").read_text())["status"] == status
    assert reconcile_abandoned(tmp_path) == []


def test_run_json_names_its_driver(tmp_path: Path) -> None:
    ends = resolve_ends("reference", Overrides())
    spec = probe_spec(ends.candidate, "ci")
    record = RunRecord.begin(tmp_path, command=[], profile="reference", overrides=Overrides(),
                             good_overrides=ends.good_overrides, use_cache=True, spec=spec,
                             good=ends.good, candidate=ends.candidate)
    assert record.doc["driver"] == {"pid": os.getpid(),
                                    "start_time": procfs.start_time(os.getpid())}


@pytest.mark.parametrize("verified", [True, False, None])
def test_only_a_verified_good_end_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            verified: bool | None) -> None:
    monkeypatch.setenv("DSV4BISECT_CACHE", str(tmp_path / "cache"))
    ends = resolve_ends("reference", Overrides())
    spec = probe_spec(ends.candidate, "ci")
    run_dir = tmp_path / "run"
    for sub in ("baseline", "baseline-repeat"):
        (run_dir / sub).mkdir(parents=True)
    record = RunRecord(run_dir / "run.json", {"notes": []})
    sup = Supervisor()
    trial = Trial(ends, spec, run_dir, record, sup, ignore, None, True)
    trial.arms["baseline"] = EngineArm("baseline", ends.good, run_dir / "baseline", sup, ignore)
    trial.arms["baseline"].verified = verified
    trial._store(cache.BaselineKey.of(ends.good.fingerprint, spec))
    entries = list((tmp_path / "cache" / "baselines").glob("*")) \
        if (tmp_path / "cache" / "baselines").exists() else []
    if verified:
        assert len(entries) == 1 and "baseline cached at" in record.doc["notes"][-1]
    else:
        assert entries == [] and "baseline not cached" in record.doc["notes"][-1]
