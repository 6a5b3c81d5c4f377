"""The SGLang wheels the tests read (never imported, never committed).

One wheel per verified release (`dsv4bisect.base.versions.VERIFIED`), downloaded with
`pip download --no-deps` into a cache outside the repository (`$DSV4BISECT_SGLANG_WHEELS`,
default ~/.cache/dsv4bisect/sglang-wheels), all missing ones at once in parallel; a wheel already
there is reused. Only the files the checks need are read from each zip. A test may skip only
when the package index cannot be reached at all: once the index has answered (a wheel came, or
pip said a version does not exist), a missing wheel fails the test instead (tests/wheel_cache.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: wheel_cache.py

from wheel_cache import WheelCache  # noqa: E402

from dsv4bisect.base.versions import VERIFIED  # noqa: E402

VERSIONS = VERIFIED
# The releases whose pure-torch SGLang code the hooks are compared with (tests/sglang/
# test_hooks_vs_sglang.py): the two the plugin was built on, the first of the kernels/ops move
# and the newest.
HOOK_VERSIONS = ("0.5.13", "0.5.14", "0.5.16", VERIFIED[-1])
# The releases the fast suite reads (the README's test command, CI): the first verified release,
# the hooks' (the eras of the code the plugin patches, and the newest) and 0.5.15, the first
# with the SM120 FlashMLA backend (its first home: tests/sglang/test_hot_switch.py). Every other
# verified release is checked the same way in the slow suite: the fast one would otherwise
# download all 13 wheels (266 MB) and run the same checks eight times more (~1 min).
FAST_VERSIONS = tuple(v for v in VERSIONS if v in {VERSIONS[0], "0.5.15", *HOOK_VERSIONS})


def tiered(versions: tuple[str, ...], fast: tuple[str, ...] = FAST_VERSIONS) -> list:
    """`versions` as pytest parameters, those not in `fast` marked `slow`."""
    import pytest

    return [pytest.param(v, marks=() if v in fast else pytest.mark.slow) for v in versions]

ENV = "DSV4BISECT_SGLANG_WHEELS"
CACHE = WheelCache("sglang", VERSIONS, ENV, ".cache/dsv4bisect/sglang-wheels")
READ = CACHE.read  # versions whose wheel a test opened (printed at the end of the run)
wheel_dir, find_wheel, fetch_all = CACHE.wheel_dir, CACHE.find_wheel, CACHE.fetch_all
index_answered, fetch_wheel, wheel_of = CACHE.index_answered, CACHE.fetch_wheel, CACHE.wheel_of
