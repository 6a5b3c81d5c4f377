"""The SGLang wheels the tests read (never imported, never committed).

`pip download --no-deps sglang==V` into a cache outside the repository
(`$DSV4BISECT_SGLANG_WHEELS`, default ~/.cache/dsv4bisect/sglang-wheels). A wheel already
there is reused. When the package index cannot be reached the caller skips with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

VERSIONS = ("0.5.13", "0.5.14")
ENV = "DSV4BISECT_SGLANG_WHEELS"


def wheel_dir() -> Path:
    root = os.environ.get(ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache/dsv4bisect/sglang-wheels"


def find_wheel(version: str, directory: Path | None = None) -> Path | None:
    d = directory or wheel_dir()
    found = sorted(d.glob(f"sglang-{version}-*.whl")) if d.is_dir() else []
    return found[0] if found else None


def fetch_wheel(version: str) -> tuple[Path | None, str]:
    """(wheel path, "") or (None, why it could not be downloaded)."""
    have = find_wheel(version)
    if have is not None:
        return have, ""
    d = wheel_dir()
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "--dest", str(d), "--quiet", f"sglang=={version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"pip download sglang=={version} failed: {exc}"
    have = find_wheel(version)
    if proc.returncode != 0 or have is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return None, f"pip download sglang=={version} failed: {' | '.join(tail)}"
    return have, ""


def wheel_of(version: str) -> Path:
    """The wheel, or skip the calling test with the reason it cannot be downloaded."""
    import pytest

    path, why = fetch_wheel(version)
    if path is None:
        pytest.skip(f"cannot download the sglang {version} wheel: {why}")
    return path
