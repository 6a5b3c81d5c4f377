"""The probe, its command and the heatmap import without torch (and matplotlib stays lazy)."""

from __future__ import annotations

import subprocess
import sys


def test_probe_modules_import_without_torch_or_matplotlib() -> None:
    code = (
        "import sys\n"
        "import dsv4bisect.cli.probe, dsv4bisect.probe.session, dsv4bisect.report.heatmap\n"
        "import dsv4bisect.probe.sequential_run, dsv4bisect.probe.sequential_plan\n"
        "bad = [m for m in ('torch', 'triton', 'numpy', 'matplotlib') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
