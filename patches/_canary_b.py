"""canary-b — a test-only patch: the other half of a deliberately broken interacting pair.

Speeds up: nothing. It exists to test the search end to end on the embedded engine: `canary-a`
and `canary-b` are each exactly inert, and together they zero the model's final hidden state
(every logit equal, garbage answers). A search that cannot name the pair is broken.

Numerical risk: none alone; total together (test only).

How to verify: `DSV4BISECT_TEST_PATCHES=1 dsv4bisect bisect ...` must name {canary-a, canary-b}.

Upstream site: none. Registered only when DSV4BISECT_TEST_PATCHES=1 (never in a real search).
"""

from __future__ import annotations

from dsv4bisect.patches._canary_a import canary_patch

PATCH = canary_patch("canary-b", "canary-a", __doc__ or "")
