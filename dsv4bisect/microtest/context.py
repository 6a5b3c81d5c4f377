"""What every check gets: the spec, the weights, the activations, the model config, the device.

A check module (`check_*.py`) exports `PATCH` (the patch name), `applies(ctx, layer)`,
`needs(ctx, layer) -> list[str]` (the tensor names it reads, checked before anything runs) and
`run(ctx, layer) -> list[Row]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4bisect.microtest.activations import Activations
from dsv4bisect.microtest.spec import MicrotestSpec
from dsv4bisect.microtest.weights import WeightSource
from dsv4bisect.reference.config import ModelArgs


@dataclass(frozen=True)
class Context:
    spec: MicrotestSpec
    weights: WeightSource
    acts: Activations
    device: torch.device

    @property
    def args(self) -> ModelArgs:
        return self.weights.args

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def variant(self, patch: str) -> str | None:
        return self.spec.patches.get(patch)

    def is_fault(self, patch: str, variant: str) -> bool:
        from dsv4bisect.patching.registry import get_patch

        v = get_patch(patch).variant(variant)
        return bool(v and v.fault)

    def counted(self, patch: str, variant: str) -> bool:
        """A row of `variant` counts unless it is a fault variant the user did not select."""
        return not self.is_fault(patch, variant) or self.variant(patch) == variant


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got − ref‖ / ‖ref‖ in fp64 (0 when both are 0)."""
    num = (got.double() - ref.double()).norm()
    den = ref.double().norm()
    return float(num / den) if float(den) > 0 else float(num)


def max_abs(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max()) if got.numel() else 0.0
