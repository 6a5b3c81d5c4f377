"""The vLLM wheels the slow tests read (never imported, never committed).

One wheel per verified release (`dsv4bisect.base.vllm_releases.VERIFIED`, 240–320 MB each),
downloaded with `pip download --no-deps` into a cache outside the repository
(`$DSV4BISECT_VLLM_WHEELS`, default ~/.cache/dsv4bisect/vllm-wheels), the missing ones in
parallel; a wheel already there is reused. Only the files a check needs are read from each zip.
A test may skip only when the package index cannot be reached at all: once it has answered (a
wheel came, or pip said a version does not exist), a missing wheel fails the test instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

from dsv4bisect.base.vllm_releases import VERIFIED

VERSIONS = VERIFIED
ENV = "DSV4BISECT_VLLM_WHEELS"
READ: set[str] = set()  # versions whose wheel a test opened (printed at the end of the run)
_ANSWERED = ("No matching distribution", "Could not find a version")


def wheel_dir() -> Path:
    root = os.environ.get(ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache/dsv4bisect/vllm-wheels"


def find_wheel(version: str, directory: Path | None = None) -> Path | None:
    d = directory or wheel_dir()
    found = sorted(d.glob(f"vllm-{version}-*.whl")) if d.is_dir() else []
    return found[0] if found else None


def _download(version: str) -> tuple[Path | None, str]:
    have = find_wheel(version)
    if have is not None:
        return have, ""
    d = wheel_dir()
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "--dest", str(d), "--quiet", f"vllm=={version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"pip download vllm=={version} failed: {exc}"
    have = find_wheel(version)
    if proc.returncode != 0 or have is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return None, f"pip download vllm=={version} failed: {' | '.join(tail)}"
    return have, ""


@cache
def fetch_all() -> dict[str, tuple[Path | None, str]]:
    """Every verified release's wheel (downloaded in parallel where missing)."""
    with ThreadPoolExecutor(max_workers=5) as pool:
        return dict(zip(VERSIONS, pool.map(_download, VERSIONS)))


def index_answered() -> bool:
    got = fetch_all().values()
    return any(p is not None for p, _ in got) or any(a in why for _, why in got for a in _ANSWERED)


def fetch_wheel(version: str) -> tuple[Path | None, str]:
    if version in VERSIONS:
        return fetch_all()[version]
    return _download(version)


def wheel_of(version: str) -> Path:
    """The wheel; skip when the index is unreachable, fail when it answered but this is missing."""
    import pytest

    path, why = fetch_wheel(version)
    if path is None:
        if index_answered():
            pytest.fail(f"the vllm {version} wheel is missing although the index answered: {why}")
        pytest.skip(f"cannot reach the package index for the vllm {version} wheel: {why}")
    READ.add(version)
    return path
