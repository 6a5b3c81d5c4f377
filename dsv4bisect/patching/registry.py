"""The ordered, frozen registry of built-in patches.

The registry is the explicit tuple `dsv4bisect.patches.PATCH_MODULES`: no directory scanning, no
import-time registration. Importing it imports no torch (patch modules are declarations).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType

from dsv4bisect.errors import PatchError, did_you_mean
from dsv4bisect.patching.spec import Patch

TEST_PATCHES_ENV = "DSV4BISECT_TEST_PATCHES"


def builtin_patches() -> Mapping[str, Patch]:
    """Name -> Patch, in registry order (plus the test-only pair when DSV4BISECT_TEST_PATCHES=1)."""
    return _registry(os.environ.get(TEST_PATCHES_ENV) == "1")


@cache
def _registry(with_test_patches: bool) -> Mapping[str, Patch]:
    from dsv4bisect.patches import PATCH_MODULES, TEST_PATCH_MODULES

    modules = PATCH_MODULES + (TEST_PATCH_MODULES if with_test_patches else ())
    out: dict[str, Patch] = {}
    for module_name in modules:
        module = importlib.import_module(f"dsv4bisect.patches.{module_name}")
        patch: Patch = module.PATCH
        if patch.name != module_name.strip("_").replace("_", "-"):
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
