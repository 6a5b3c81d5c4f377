"""`--out` that cannot hold run directories: one `error:` line, a `hint:`, exit 5, no traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from run_helpers import cli

from dsv4bisect.engines.rundir import RunsRootError, ensure_runs_root


def _unwritable(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        path = tmp_path / "ro"
        path.mkdir()
        path.chmod(0o555)
        return path
    path = Path("/sys/kernel")  # root writes anywhere except a read-only mount / sysfs
    if not path.is_dir() or os.access(path, os.W_OK) and _can_create(path):
        pytest.skip("no directory this root user cannot write")
    return path


def _can_create(path: Path) -> bool:
    try:
        (path / ".dsv4bisect-probe").mkdir()
    except OSError:
        return False
    (path / ".dsv4bisect-probe").rmdir()
    return True


@pytest.mark.parametrize("case", ["file", "missing-parent", "read-only"])
def test_a_runs_root_that_cannot_hold_runs_is_refused(tmp_path: Path, case: str) -> None:
    out = {"file": Path("/etc/passwd"), "missing-parent": tmp_path / "no" / "such",
           "read-only": _unwritable(tmp_path) if case == "read-only" else None}[case]
    assert out is not None
    with pytest.raises(RunsRootError) as info:
        ensure_runs_root(out)
    assert info.value.hint
    assert not (tmp_path / "no").exists()  # a missing parent is not created


@pytest.mark.parametrize("command", ["run", "bisect"])
def test_the_cli_says_why_in_one_line_with_a_hint(tmp_path: Path, command: str) -> None:
    # bisect with a test command: were the check missing, it would not launch engines either
    extra = ("--test-cmd", "true") if command == "bisect" else ()
    for out in (Path("/etc/passwd"), tmp_path / "no" / "such", _unwritable(tmp_path)):
        r = cli(command, "reference-all", "--tier", "ci", "--out", out, *extra,
                cache=tmp_path / "c", timeout=120)
        assert r.returncode == 5, r.stderr
        lines = r.stderr.strip().splitlines()
        assert lines[-2].startswith("error:") and str(out) in lines[-2], r.stderr
        assert lines[-1].startswith("hint:") and "Traceback" not in r.stderr


def test_a_new_runs_root_is_created(tmp_path: Path) -> None:
    assert ensure_runs_root(tmp_path / "runs").is_dir()
