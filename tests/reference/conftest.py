"""Fixtures shared by the embedded engine's tests."""

from __future__ import annotations

import pytest
import torch

from dsv4bisect.reference.checkpoint import random_model
from dsv4bisect.reference.config import ModelArgs, Numerics
from dsv4bisect.reference.model import Transformer


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Other processes share the 2 cores; one thread keeps timings stable (results are exact)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> Transformer:
    """The seed-0 random `tiny` model, all patches off (a test may reconfigure it)."""
    m = random_model(ModelArgs.preset("tiny"), seed=0)
    m.configure(Numerics())
    return m
