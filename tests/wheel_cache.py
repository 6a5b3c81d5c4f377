"""A cache of one package's PyPI wheels for the tests that read them (never imported, never
committed): `pip download --no-deps` of every wanted release into a directory outside the
repository, each when a test first asks for it (`fetch_all` gets the missing ones in parallel); a
wheel already there is reused. A test may skip only when the package index cannot be reached at
all: once the index has answered (a wheel came, or pip said a version does not exist), a missing
wheel fails the test instead. Used by tests/sglang/wheels.py and tests/vllm/vllm_wheels.py."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_ANSWERED = ("No matching distribution", "Could not find a version")  # the index did answer


class WheelCache:
    def __init__(self, package: str, versions: tuple[str, ...], env: str, default: str,
                 workers: int = 8, timeout_s: float = 600) -> None:
        self.package, self.versions, self.env, self.default = package, versions, env, default
        self.workers, self.timeout_s = workers, timeout_s
        self.read: set[str] = set()  # versions whose wheel a test opened
        self._got: dict[str, tuple[Path | None, str]] = {}  # per release asked for

    def wheel_dir(self) -> Path:
        root = os.environ.get(self.env)
        return Path(root).expanduser() if root else Path.home() / self.default

    def find_wheel(self, version: str, directory: Path | None = None) -> Path | None:
        d = directory or self.wheel_dir()
        found = sorted(d.glob(f"{self.package}-{version}-*.whl")) if d.is_dir() else []
        return found[0] if found else None

    def download(self, version: str) -> tuple[Path | None, str]:
        have = self.find_wheel(version)
        if have is not None:
            return have, ""
        d = self.wheel_dir()
        d.mkdir(parents=True, exist_ok=True)
        spec = f"{self.package}=={version}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--dest", str(d), "--quiet", spec]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"pip download {spec} failed: {exc}"
        have = self.find_wheel(version)
        if proc.returncode != 0 or have is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return None, f"pip download {spec} failed: {' | '.join(tail)}"
        return have, ""

    def fetch_all(self) -> dict[str, tuple[Path | None, str]]:
        """Every wanted release's wheel (downloaded in parallel where missing)."""
        missing = [v for v in self.versions if v not in self._got]
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            self._got.update(zip(missing, pool.map(self.download, missing)))
        return {v: self._got[v] for v in self.versions}

    def index_answered(self) -> bool:
        """Whether a download so far reached the index (a wheel came, or pip said a version
        does not exist)."""
        got = self._got.values()
        return any(p is not None for p, _ in got) or \
            any(a in why for _, why in got for a in _ANSWERED)

    def fetch_wheel(self, version: str) -> tuple[Path | None, str]:
        """(wheel path, "") or (None, why it could not be downloaded): only the release asked
        for, so a run that reads a few releases downloads only their wheels."""
        if version not in self._got:
            self._got[version] = self.download(version)
        return self._got[version]

    def wheel_of(self, version: str) -> Path:
        """The wheel; skip when the index is unreachable, fail when it answered but this is
        missing."""
        import pytest

        path, why = self.fetch_wheel(version)
        if path is None:
            if self.index_answered():
                pytest.fail(f"the {self.package} {version} wheel is missing although the index "
                            f"answered: {why}")
            pytest.skip(f"cannot reach the package index for the {self.package} {version} "
                        f"wheel: {why}")
        self.read.add(version)
        return path
