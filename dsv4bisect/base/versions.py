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
    """An engine release (SGLang's, or vLLM's: `vllm_releases.VllmInfo`; version None: not
    installed) and its hook layout (None: refused). `verified` is False for a release outside
    the verified list; `warning` says so when it was allowed."""

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


@dataclass(frozen=True)
class ReleaseSet:
    """One engine's verified releases and hook layouts, and the verdict on a version string:
    a layout, or the refusal (and, opted in, the warning) for anything else."""

    engine: str  # as the messages name it: SGLang | vLLM
    verified: tuple[str, ...]
    layout_starts: tuple[tuple[str, tuple[int, ...]], ...]
    too_old: str  # why a release before the first layout is refused
    listing: str  # how a refusal names the verified releases
    opt_in: str  # the flag that allows an unverified release

    def layout_of_range(self, parsed: tuple[int, ...]) -> str:
        """The layout of the range `parsed` falls in (the newest one past the end)."""
        name = self.layout_starts[0][0]
        for layout, first in self.layout_starts:
            if parsed[:3] >= first:
                name = layout
        return name

    def check(self, version: str, allow_unverified: bool = False) -> SglangInfo:
        parsed = parse_version(version)
        if parsed is not None and parsed[:3] == (0, 0, 0):
            parsed = None  # a source build's placeholder (setuptools-scm's fallback)
        if parsed is not None and parsed[:3] < self.layout_starts[0][1]:
            return SglangInfo(version, None, f"{self.engine} {version} {self.too_old}",
                              verified=False)
        if version.strip() in self.verified:
            assert parsed is not None
            return SglangInfo(version, self.layout_of_range(parsed))
        what = (f"{self.engine} {version} is not a verified release ({self.listing})"
                if parsed is not None else
                f"{self.engine} {version} is a source or dev build whose version proves "
                f"nothing (newest verified release: {self.verified[-1]})")
        if not allow_unverified:
            return SglangInfo(version, None, what, verified=False)
        layout = self.layout_of_range(parsed) if parsed is not None else \
            self.layout_starts[-1][0]
        return SglangInfo(version, layout, None, verified=False,
                          warning=f"{what}; using the {layout} hook layout as asked "
                                  f"({self.opt_in})")


SGLANG = ReleaseSet("SGLang", VERIFIED, LAYOUT_STARTS,
                    "predates the DeepSeek-V4 SM120 paths the patches hook (first supported: "
                    "0.5.13)", f"newest verified: {NEWEST_VERIFIED}",
                    "--allow-unverified-sglang")


def layout_of_range(parsed: tuple[int, ...]) -> str:
    """The SGLang layout of the range `parsed` falls in (the newest one past the end)."""
    return SGLANG.layout_of_range(parsed)


def allowed_by_env() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def check_version(version: str, allow_unverified: bool = False) -> SglangInfo:
    """Layout, verification and the refusal or warning for an SGLang version string."""
    return SGLANG.check(version, allow_unverified)


def detect_sglang(dist: str = "sglang", allow_unverified: bool | None = None) -> SglangInfo:
    """The installed SGLang, from importlib.metadata (no import of SGLang itself)."""
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return SglangInfo(None, None, "SGLang is not installed in this Python environment")
    allow = allowed_by_env() if allow_unverified is None else allow_unverified
    return check_version(version, allow)
