"""The test-only interacting pair: each half exactly inert, both together break the model."""

from __future__ import annotations

import pytest
import torch

from dsv4bisect.errors import PatchError
from dsv4bisect.reference.checkpoint import random_model
from dsv4bisect.reference.config import ModelArgs, Numerics


def test_canaries_exist_only_with_the_test_switch(monkeypatch) -> None:
    monkeypatch.delenv("DSV4BISECT_TEST_PATCHES", raising=False)
    with pytest.raises(PatchError):
        Numerics.from_patches({"canary-a": "on"})


def test_each_canary_is_inert_and_the_pair_breaks_the_logits(monkeypatch) -> None:
    monkeypatch.setenv("DSV4BISECT_TEST_PATCHES", "1")
    model = random_model(ModelArgs.preset("tiny"), 0)
    ids = torch.randint(16, 272, (40,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model.configure(Numerics.from_patches({}))
        base = model(ids)
        for one in ("canary-a", "canary-b"):
            model.configure(Numerics.from_patches({one: "on"}))
            assert torch.equal(model(ids), base)
        model.configure(Numerics.from_patches({"canary-a": "on", "canary-b": "on"}))
        broken = model(ids)
    assert not torch.allclose(broken, base)
    assert torch.allclose(broken, broken[:1].expand_as(broken))  # same logits everywhere
