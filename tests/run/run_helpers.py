"""Shared by the run tests: the CLI as a subprocess, test profiles, engine processes of a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
FAULT_SERVER = HERE / "fault_server.py"
SERVE_ARGS = ["--host", "{host}", "--port", "{port}", "--checkpoint", "random", "--device", "cpu"]


def cli(*args: str | Path, cache: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DSV4BISECT_CACHE": str(cache), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "dsv4bisect", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def command_profile(tmp_path: Path, name: str, argv: list[str], *, patches: tuple[str, ...] = (),
                    ready: str = "/health_generate", timeout: float = 120) -> Path:
    """A `kind: command` profile; `patches` are on in it (off at its good end)."""
    items = "".join(f"\n      - {a!r}" for a in argv)
    toggles = "".join(f"\n  {p}: true" for p in patches)
    text = (f"schema_version: 1\nname: {name}\nengine:\n  kind: command\n"
            f"  startup_timeout_s: {timeout}\n  command:\n    ready_path: {ready}\n"
            f"    argv:{items}\n" + (f"patches:{toggles}\n" if patches else ""))
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def fault_profile(tmp_path: Path, name: str, when: str, *mode: str) -> Path:
    argv = [sys.executable, str(FAULT_SERVER), "--when", when, *mode, "--", *SERVE_ARGS]
    return command_profile(tmp_path, name, argv, patches=(when,))


def only_run_dir(runs: Path) -> Path:
    dirs = [d for d in runs.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # a zombie answers kill(0) but holds nothing
    return stat.exists() and stat.read_text().split()[2] != "Z"


def engine_pids(run_dir: Path) -> set[int]:
    """Live processes started for this run: their environment names its receipts directory."""
    marker = f"DSV4BISECT_RECEIPTS={run_dir.resolve()}/".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ and alive(int(entry.name)):
            found.add(int(entry.name))
    return found
