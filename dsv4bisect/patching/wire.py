"""The `DSV4BISECT_PATCHES` wire format (DESIGN §3).

A comma-separated list of `name` or `name:variant`, in registry order. The default variant is
written as the bare name. Unknown names and variants are errors (exit 5), never ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

from dsv4bisect.errors import PatchError, did_you_mean
from dsv4bisect.patching.registry import unknown_patch_hint
from dsv4bisect.patchspec.spec import Patch

ENV_VAR = "DSV4BISECT_PATCHES"


def format_patch_set(selected: Mapping[str, str], known: Mapping[str, Patch]) -> str:
    """Render {name: variant} in the order of `known`; unknown names raise PatchError."""
    for name in selected:
        if name not in known:
            raise PatchError(f"unknown patch `{name}`", unknown_patch_hint(name, known))
    parts = []
    for name, patch in known.items():
        if name in selected:
            variant = selected[name]
            parts.append(name if variant == patch.default_variant else f"{name}:{variant}")
    return ",".join(parts)


def parse_patch_set(text: str, known: Mapping[str, Patch]) -> dict[str, str]:
    """Parse the wire format into {name: variant} in registry order."""
    selected: dict[str, str] = {}
    for raw in (t.strip() for t in text.split(",")):
        if not raw:
            continue
        name, _, variant = raw.partition(":")
        if name not in known:
            raise PatchError(f"unknown patch `{name}` in {ENV_VAR}", unknown_patch_hint(name, known))
        patch = known[name]
        variant = variant or patch.default_variant
        if patch.variant(variant) is None:
            names = [v.name for v in patch.variants]
            guess = did_you_mean(variant, names)
            raise PatchError(
                f"patch `{name}` has no variant `{variant}`",
                f"{guess + ' ' if guess else ''}variants of {name}: {', '.join(names)}",
            )
        if name in selected:
            raise PatchError(f"patch `{name}` listed twice in {ENV_VAR}", "list each patch once")
        selected[name] = variant
    order = list(known)
    return {n: selected[n] for n in sorted(selected, key=order.index)}
