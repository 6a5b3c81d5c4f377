"""Kernel tests run the Triton kernels on CUDA when present, else under Triton's CPU
interpreter. The kernels are built lazily, so setting TRITON_INTERPRET here, before any kernel
runs, is enough."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:  # a plain checkout (e.g. the GPU box) where the package is not pip-installed
    import dsv4bisect.kernels  # noqa: F401
except ImportError:
    import dsv4bisect

    dsv4bisect.__path__.append(str(Path(__file__).resolve().parents[2]))


@pytest.fixture
def dev() -> str:
    """Where the Triton wrappers run: cuda, or cpu under the interpreter."""
    from dsv4bisect.kernels._triton import interpreter_active, triton_available

    if not triton_available():
        pytest.skip("Triton is not installed")
    if torch.cuda.is_available() and not interpreter_active():
        return "cuda"
    if not interpreter_active():
        pytest.skip("no CUDA and TRITON_INTERPRET is not set")
    return "cpu"
