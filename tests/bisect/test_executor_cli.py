"""`bisect --executor ray` where Ray cannot be imported (as in CI, which does not install the
extra): one `error:` line with the install hint, exit 5, and no ledger or run directory. The
import is blocked in the real CLI process (`sys.modules["ray"] = None`), so this holds on a
machine that has Ray too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

NO_RAY = ("import runpy, sys; sys.modules['ray'] = None; "
          "runpy.run_module('dsv4bisect', run_name='__main__')")


def test_executor_ray_without_ray_is_one_error_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", NO_RAY, "bisect", "--tier", "ci", "--executor",
                        "ray", "--out", str(out)], capture_output=True, text=True,
                       env={**os.environ, "NO_COLOR": "1"}, timeout=300, check=False)
    assert r.returncode == 5, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:"))]
    assert lines[0].startswith("error: --executor ray needs Ray, which is not installed")
    assert lines[1] == "hint: pip install 'dsv4bisect[ray]' (on the driver and on every node)"
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not out.exists() or not any(out.iterdir()), "the bisect wrote something"


def test_only_the_ray_executor_imports_ray() -> None:
    package = Path(__file__).parents[2] / "dsv4bisect"
    importers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                       if any(line.lstrip().startswith(("import ray", "from ray"))
                              for line in p.read_text().splitlines()))
    assert importers == ["bisect/ray_executor.py"]
    code = ("import sys, dsv4bisect.cli, dsv4bisect.bisect.executors, "
            "dsv4bisect.bisect.remote_trial, dsv4bisect.engines.reaper; "
            "print([m for m in ('ray', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
