"""canary-a — a test-only patch: half of a deliberately broken interacting pair.

Speeds up: nothing. It exists to test the search end to end on the embedded engine: `canary-a`
and `canary-b` are each exactly inert, and together they zero the model's final hidden state
(every logit equal, garbage answers). A search that cannot name the pair is broken.

Numerical risk: none alone; total together (test only).

How to verify: `DSV4BISECT_TEST_PATCHES=1 dsv4bisect bisect ...` must name {canary-a, canary-b}.

Upstream site: none. Registered only when DSV4BISECT_TEST_PATCHES=1 (never in a real search).
"""

from __future__ import annotations

from dsv4bisect.patching.spec import Patch, SglangDelivery, Variant

PATCH = Patch(
    name="canary-a",
    summary="test only: with canary-b, zeroes the final hidden state (an interacting pair)",
    tier=3,
    touches=("test-only",),
    reference="nothing alone; with canary-b the final hidden state is zeroed",
    sglang=SglangDelivery(hooks={}),
    variants=(Variant("on", "inert alone", fault=True),),
    doc=__doc__ or "",
    test_only=True,
)
