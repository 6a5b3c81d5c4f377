"""Which SGLang is installed, whether that release was verified, and which hook layout fits it.

A layout names a set of hook targets, the symbols the hook bodies call, and their expected
signatures (`targets.py`); a new layout starts wherever a release moved one of them. Every
release in `VERIFIED` was read against its own PyPI wheel (tests/sglang). A release outside that
list — newer than the newest verified one, a pre-release, or a source / dev build whose version
proves nothing (`0.0.0.dev0`, a git checkout) — is *unverified*: the plugin and `doctor` refuse
it, unless the user opts in (`--allow-unverified-sglang`, profile key
`engine.allow_unverified_sglang`, env `DSV4BISECT_ALLOW_UNVERIFIED_SGLANG=1`), and then they
warn and use the layout of the range the version falls in (the newest one past the end). There
is no silent fallback. Imports no torch and no SGLang (the version comes from the installed
distribution's metadata).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata

from dsv4bisect import env as envvars

# Every release from the first with DeepSeek-V4's SM120 paths, each read against its own wheel.
VERIFIED = ("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17",
            "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
NEWEST_VERIFIED = VERIFIED[-1]
# (layout, first release it covers): what moved is said in targets.py beside each layout.
LAYOUT_STARTS = (("0.5.13", (0, 5, 13)), ("0.5.14", (0, 5, 14)), ("0.5.16", (0, 5, 16)),
                 ("0.5.19", (0, 5, 19)), ("0.5.21", (0, 5, 21)), ("0.5.23", (0, 5, 23)))
LAYOUTS = tuple(name for name, _ in LAYOUT_STARTS)
FIRST_SUPPORTED = LAYOUT_STARTS[0][1]
ALLOW_ENV = envvars.ALLOW_UNVERIFIED_SGLANG


@dataclass(frozen=True)
class SglangInfo:
    """The installed SGLang (version None: not installed) and its hook layout (None: refused).
    `verified` is False for a release outside VERIFIED; `warning` says so when it was allowed."""

    version: str | None
    layout: str | None
    reason: str | None = None  # why there is no layout
    verified: bool = True
    warning: str | None = None

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        return parse_version(self.version) if self.version else None


def parse_version(text: str) -> tuple[int, ...] | None:
    """'0.5.13' -> (0, 5, 13); '0.5.13.post1' -> (0, 5, 13, 1); '0.5.14rc0' -> (0, 5, 14);
    junk -> None. A post release sorts after its base and before the next release."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?post(\d+))?", text)
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def is_verified(version: str) -> bool:
    return version.strip() in VERIFIED


def layout_of_range(parsed: tuple[int, ...]) -> str:
    """The layout of the range `parsed` falls in (the newest one past the end)."""
    name = LAYOUTS[0]
    for layout, first in LAYOUT_STARTS:
        if parsed[:3] >= first:
            name = layout
    return name


def allowed_by_env() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def check_version(version: str, allow_unverified: bool = False) -> SglangInfo:
    """Layout, verification and the refusal or warning for an SGLang version string."""
    parsed = parse_version(version)
    if parsed is not None and parsed[:3] == (0, 0, 0):
        parsed = None  # a source build's placeholder (setuptools-scm's fallback), not a release
    if parsed is not None and parsed[:3] < FIRST_SUPPORTED:
        return SglangInfo(version, None, f"SGLang {version} predates the DeepSeek-V4 SM120 paths "
                          "the patches hook (first supported: 0.5.13)", verified=False)
    if is_verified(version):
        assert parsed is not None
        return SglangInfo(version, layout_of_range(parsed))
    what = (f"SGLang {version} is not a verified release (newest verified: {NEWEST_VERIFIED})"
            if parsed is not None else
            f"SGLang {version} is a source or dev build whose version proves nothing "
            f"(newest verified release: {NEWEST_VERIFIED})")
    if not allow_unverified:
        return SglangInfo(version, None, what, verified=False)
    layout = layout_of_range(parsed) if parsed is not None else LAYOUTS[-1]
    return SglangInfo(version, layout, None, verified=False,
                      warning=f"{what}; using the {layout} hook layout as asked "
                              "(--allow-unverified-sglang)")


def detect_sglang(dist: str = "sglang", allow_unverified: bool | None = None) -> SglangInfo:
    """The installed SGLang, from importlib.metadata (no import of SGLang itself)."""
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return SglangInfo(None, None, "SGLang is not installed in this Python environment")
    allow = allowed_by_env() if allow_unverified is None else allow_unverified
    return check_version(version, allow)
