"""Wheel-based SGLang checks: the wheels are downloaded once (pip download --no-deps) into a
cache outside the repository; tests skip with the reason only if the index is unreachable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # wheels.py, sglang_tree.py

try:  # a plain checkout (the GPU box) where the package is not pip-installed
    import dsv4bisect.kernels  # noqa: F401
except ImportError:
    import dsv4bisect

    dsv4bisect.__path__.append(str(Path(__file__).resolve().parents[2]))

from wheels import HOOK_VERSIONS, READ, VERSIONS, tiered, wheel_of  # noqa: E402

try:  # Triton fixes interpreted vs compiled early: decide before any kernel is built
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(scope="session", params=tiered(VERSIONS))
def wheel(request: pytest.FixtureRequest) -> Path:
    """Every verified release's wheel (the static checks; the fast suite's releases are
    `wheels.FAST_VERSIONS`, the others run in the slow one)."""
    return wheel_of(request.param)


@pytest.fixture(scope="session", params=HOOK_VERSIONS)
def hook_wheel(request: pytest.FixtureRequest) -> Path:
    """The releases whose torch code the hooks are compared with."""
    return wheel_of(request.param)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if READ:
        order = [v for v in VERSIONS if v in READ]
        terminalreporter.write_line(f"sglang wheels read: {len(READ)} of {len(VERSIONS)} "
                                    f"verified releases ({', '.join(order)})")
