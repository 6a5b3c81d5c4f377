"""canary-a — a test-only patch: half of a deliberately broken interacting pair.

Speeds up: nothing. It exists to test the search end to end on the embedded engine: `canary-a`
and `canary-b` are each exactly inert, and together they zero the model's final hidden state
(every logit equal, garbage answers). A search that cannot name the pair is broken.

Numerical risk: none alone; total together (test only).

How to verify: `DSV4BISECT_TEST_PATCHES=1 dsv4bisect bisect ...` must name {canary-a, canary-b}.

Upstream site: none. Registered only when DSV4BISECT_TEST_PATCHES=1 (never in a real search).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dsv4bisect.patchspec.spec import Patch, SglangDelivery, Variant
from dsv4bisect.patchspec.swaps import Op, Site, Swap

if TYPE_CHECKING:
    import torch


def _zeroed(x: torch.Tensor) -> torch.Tensor:
    return x * 0.0


def _with(partner: str) -> Callable[[Site], Callable[..., torch.Tensor] | None]:
    """Embedded swap (`Op.HEAD_INPUT`): the final state zeroed when the partner is on too."""
    return lambda site: _zeroed if partner in site.patches else None


def canary_patch(name: str, partner: str, doc: str) -> Patch:
    """One half of the pair; `partner` is the other half (the pair is symmetric)."""
    return Patch(
        name=name,
        summary=f"test only: with {partner}, zeroes the final hidden state (an interacting pair)",
        tier=3,
        touches=("test-only",),
        reference=f"nothing alone; with {partner} the final hidden state is zeroed",
        sglang=SglangDelivery(hooks={}),
        variants=(Variant("on", "inert alone", fault=True),),
        doc=doc,
        test_only=True,
        swaps=(Swap(Op.HEAD_INPUT, _with(partner)),),
    )


PATCH = canary_patch("canary-a", "canary-b", __doc__ or "")
