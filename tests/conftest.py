"""Shared test setup: markers, an isolated cache directory, the GPU skip, and Hypothesis.

Property tests draw the same examples on every run (`derandomize`), so CI passes or fails on
the code, not on the draw; `HYPOTHESIS_PROFILE=explore` draws fresh examples to hunt for more.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = [item for item in items if "gpu" in item.keywords]
    if not gpu or _has_cuda():  # torch is imported only when a gpu test was collected
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in gpu:
        item.add_marker(skip_gpu)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never read or write the user's ~/.cache/dsv4bisect."""
    monkeypatch.setenv("DSV4BISECT_CACHE", str(tmp_path_factory.mktemp("cache")))
