"""The ordered, frozen registry of patches.

The registry is the explicit tuple `dsv4bisect.patches.PATCH_MODULES`: no directory scanning, no
import-time registration. Test-only patches join it only when asked, after the built-ins: the
canary pair (`DSV4BISECT_TEST_PATCHES=1`) and patch modules from outside the package, named by
import path in `DSV4BISECT_TEST_PATCH_MODULES` (a test's own patch in a temporary package; each
must declare `test_only=True`). Importing it imports no torch (patch modules import torch only
in the bodies of their swaps and hooks).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType

from dsv4bisect import env as envvars
from dsv4bisect.errors import PatchError, did_you_mean
from dsv4bisect.patchspec.spec import Patch


def builtin_patches() -> Mapping[str, Patch]:
    """Name -> Patch, in registry order (plus the test-only ones the environment asks for)."""
    return _registry(os.environ.get(envvars.TEST_PATCHES) == "1", extra_modules())


def extra_modules() -> tuple[str, ...]:
    """The import paths `DSV4BISECT_TEST_PATCH_MODULES` names, in its order."""
    raw = os.environ.get(envvars.TEST_PATCH_MODULES, "")
    return tuple(m.strip() for m in raw.split(",") if m.strip())


def extra_module_files() -> list[Path]:
    """The source files of those modules (what the code fingerprint hashes with the patches)."""
    out = []
    for name in extra_modules():
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            out.append(Path(spec.origin))
    return out


@cache
def _registry(with_test_patches: bool, extra: tuple[str, ...]) -> Mapping[str, Patch]:
    from dsv4bisect.patches import PATCH_MODULES, TEST_PATCH_MODULES

    own = PATCH_MODULES + (TEST_PATCH_MODULES if with_test_patches else ())
    out: dict[str, Patch] = {}
    for module_name in [f"dsv4bisect.patches.{m}" for m in own] + list(extra):
        patch = _load(module_name, outside=module_name in extra)
        if patch.name in out:
            raise PatchError(f"duplicate patch name `{patch.name}` ({module_name})",
                             "give every patch module its own name")
        out[patch.name] = patch
    return MappingProxyType(out)


def _load(module_name: str, *, outside: bool) -> Patch:
    """The `PATCH` a patch module declares, its name agreeing with the module's."""
    hint = f"{envvars.TEST_PATCH_MODULES} names importable modules that each declare PATCH"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if not outside:
            raise
        raise PatchError(f"cannot import test patch module `{module_name}`: {exc}", hint) from exc
    patch = getattr(module, "PATCH", None) if outside else module.PATCH
    if not isinstance(patch, Patch):
        raise PatchError(f"module `{module_name}` declares no `PATCH = Patch(...)`", hint)
    expected = module_name.rsplit(".", 1)[-1].strip("_").replace("_", "-")
    if patch.name != expected:
        raise PatchError(f"patch module `{module_name}` declares the name `{patch.name}`",
                         f"name it `{expected}`, after its module")
    if outside and not patch.test_only:
        raise PatchError(f"`{patch.name}` ({module_name}) is not declared test_only",
                         "a patch from outside dsv4bisect.patches must set test_only=True; "
                         "a real patch goes in patches/ and its ordered list")
    return patch


def get_patch(name: str) -> Patch:
    patches = builtin_patches()
    if name in patches:
        return patches[name]
    raise PatchError(f"unknown patch `{name}`", unknown_patch_hint(name, patches))


def unknown_patch_hint(name: str, known: Mapping[str, object]) -> str:
    guess = did_you_mean(name, known)
    listing = ", ".join(known)
    return f"{guess} Known patches: {listing}" if guess else f"known patches: {listing}"
