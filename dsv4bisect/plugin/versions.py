"""Which SGLang is installed, and which hook layout fits it.

A layout names a set of hook targets and their expected signatures (`targets.py`). SGLang
0.5.13 is the first release with DeepSeek-V4's SM120 paths; 0.5.14 moved a few targets
(`HashTopK` applies the routed scaling itself, `hc_pre` takes `forward_batch`, the TRT-LLM
clamp is per expert). Releases after 0.5.14 use the 0.5.14 layout as long as every target still
has its expected signature — the plugin checks that at install time and refuses otherwise.
Imports no torch and no SGLang (the version comes from the installed distribution's metadata).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

LAYOUTS = ("0.5.13", "0.5.14")
FIRST_SUPPORTED = (0, 5, 13)


@dataclass(frozen=True)
class SglangInfo:
    """The installed SGLang (version None: not installed) and its hook layout (None: unknown)."""

    version: str | None
    layout: str | None
    reason: str | None = None  # why there is no layout

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        return parse_version(self.version) if self.version else None


def parse_version(text: str) -> tuple[int, ...] | None:
    """'0.5.13.post1' -> (0, 5, 13); '0.5.14rc0' -> (0, 5, 14); junk -> None."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def layout_for(version: str) -> tuple[str | None, str | None]:
    """(layout, None) or (None, reason) for an SGLang version string."""
    parsed = parse_version(version)
    if parsed is None:
        return None, f"cannot parse SGLang version {version!r}"
    if parsed < FIRST_SUPPORTED:
        return None, (f"SGLang {version} predates the DeepSeek-V4 SM120 paths the patches hook "
                      "(first: 0.5.13)")
    if parsed[:3] == (0, 5, 13):
        return "0.5.13", None
    return "0.5.14", None


def detect_sglang(dist: str = "sglang") -> SglangInfo:
    """The installed SGLang, from importlib.metadata (no import of SGLang itself)."""
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return SglangInfo(None, None, "SGLang is not installed in this Python environment")
    layout, reason = layout_for(version)
    return SglangInfo(version, layout, reason)
