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

from wheels import VERSIONS, fetch_wheel  # noqa: E402

try:  # Triton fixes interpreted vs compiled early: decide before any kernel is built
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(scope="session", params=VERSIONS)
def wheel(request: pytest.FixtureRequest) -> Path:
    path, why = fetch_wheel(request.param)
    if path is None:
        pytest.skip(f"cannot download the sglang {request.param} wheel: {why}")
    return path
