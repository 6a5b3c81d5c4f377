"""The ordered, frozen registry of built-in patches.

The registry is the explicit tuple `dsv4bisect.patches.PATCH_MODULES`: no directory scanning, no
import-time registration. Importing it imports no torch (patch modules are declarations).
"""

from __future__ import annotations

import importlib
from functools import cache
from types import MappingProxyType
from collections.abc import Mapping

from dsv4bisect.errors import PatchError, did_you_mean
from dsv4bisect.patching.spec import Patch


@cache
def builtin_patches() -> Mapping[str, Patch]:
    """Name -> Patch, in registry order."""
    from dsv4bisect.patches import PATCH_MODULES

    out: dict[str, Patch] = {}
    for module_name in PATCH_MODULES:
        module = importlib.import_module(f"dsv4bisect.patches.{module_name}")
        patch: Patch = module.PATCH
        if patch.name != module_name.replace("_", "-"):
            raise RuntimeError(f"patch module {module_name} declares name {patch.name}")
        if patch.name in out:
            raise RuntimeError(f"duplicate patch name {patch.name}")
        out[patch.name] = patch
    return MappingProxyType(out)


def get_patch(name: str) -> Patch:
    patches = builtin_patches()
    if name in patches:
        return patches[name]
    raise PatchError(f"unknown patch `{name}`", unknown_patch_hint(name, patches))


def unknown_patch_hint(name: str, known: Mapping[str, object]) -> str:
    guess = did_you_mean(name, known)
    listing = ", ".join(known)
    return f"{guess} Known patches: {listing}" if guess else f"known patches: {listing}"
