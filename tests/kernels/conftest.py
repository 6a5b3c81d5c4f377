"""Kernel tests run the Triton kernels on CUDA when present, else under Triton's CPU
interpreter. The kernels are built lazily, so setting TRITON_INTERPRET here, before any kernel
runs, is enough."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
