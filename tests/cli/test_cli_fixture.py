"""The shared CLI fixture (conftest.py `run_dsv4bisect`) stops a CLI it gives up on as a user's
Ctrl-C would, so the engines that CLI started (in sessions of their own) stop with it instead of
loading the rest of the suite."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def test_a_cli_past_its_timeout_gets_a_ctrl_c_before_any_kill(cli, tmp_path: Path) -> None:
    mark = tmp_path / "stopped"
    code = ("try:\n"
            "    import time\n"
            "    time.sleep(120)\n"
            "except KeyboardInterrupt:  # the CLI's own Ctrl-C path stops its engines here\n"
            f"    open({str(mark)!r}, 'w').write('engines stopped')\n")
    with pytest.raises(subprocess.TimeoutExpired):
        cli(python=("-c", code), timeout=5)
    assert mark.read_text() == "engines stopped"
