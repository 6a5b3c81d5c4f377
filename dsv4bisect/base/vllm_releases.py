"""Which vLLM is installed, whether that release was verified, its hook layout and its shipped
source facts.

vLLM serves DeepSeek-V4 from 0.20.0 on (`model_executor/models/deepseek_v4.py`); by 0.22.0 the
model moved to `vllm/models/deepseek_v4/{nvidia,amd,cpu,xpu,common}/`, 0.24.0 calls the TileLang
mHC kernels by name, 0.28.0 adds the first layer's broadcast mHC pre and 0.34.0 the
residual-reusing fused post+pre (docs/vllm.md). Every release in `VERIFIED` was read against its
own PyPI wheel: the facts the plugin, `doctor`, the argv check and the probe rely on (hook
targets and their signatures, the names imported by value, `vllm serve`'s arguments, the
OpenAI request models) were extracted from it by AST (`dsv4bisect.plugin.vllm.facts`) and ship
as `vllm_data/vllm-<release>.json`, so no check needs a multi-hundred-MB wheel. A release
outside that list is *unverified* and refused unless the user opts in
(`engine.allow_unverified_vllm`, `doctor --allow-unverified-vllm`,
`DSV4BISECT_ALLOW_UNVERIFIED_VLLM=1`): then it warns and uses the layout of the range the
version falls in. Imports no torch and no vLLM.
"""

from __future__ import annotations

import json
import os
from functools import cache
from importlib import metadata, resources
from typing import Any

from dsv4bisect import env as envvars
from dsv4bisect.base.versions import ReleaseSet, SglangInfo, parse_version

VERIFIED = ("0.20.0", "0.22.0", "0.24.0", "0.28.0", "0.34.0")
NEWEST_VERIFIED = VERIFIED[-1]
FIRST_SUPPORTED = (0, 20, 0)  # the first release with DeepSeek-V4 (model_executor/models)
# (layout, first release it covers); what moved is said in vllm_hooks/targets.py
LAYOUT_STARTS = tuple((v, parse_version(v) or ()) for v in VERIFIED)
LAYOUTS = VERIFIED
ALLOW_ENV = envvars.ALLOW_UNVERIFIED_VLLM
DATA_PACKAGE = "dsv4bisect.base"
DATA_DIR = "vllm_data"
FACTS_SCHEMA = 1


VllmInfo = SglangInfo  # the same verdict shape: version, layout, reason, verified, warning
RELEASES = ReleaseSet("vLLM", VERIFIED, LAYOUT_STARTS, "predates DeepSeek-V4 support (first "
                      "release with it: 0.20.0)", f"verified: {', '.join(VERIFIED)}",
                      "--allow-unverified-vllm")


def layout_of_range(parsed: tuple[int, ...]) -> str:
    """The layout of the range `parsed` falls in (the newest one past the end)."""
    return RELEASES.layout_of_range(parsed)


def allowed_by_env() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def check_version(version: str, allow_unverified: bool = False) -> VllmInfo:
    """Layout, verification and the refusal or warning for a vLLM version string."""
    return RELEASES.check(version, allow_unverified)


def refusal_hint(info: VllmInfo) -> str:
    """What to do about a refused release (one line)."""
    if info.version is None:
        return "install vLLM in the engine's Python (engine.python) or point --vllm-src at a wheel"
    parsed = parse_version(info.version)
    if parsed is not None and (0, 0, 0) < parsed[:3] < FIRST_SUPPORTED:
        return f"upgrade vLLM to a verified release ({', '.join(VERIFIED)})"
    return (f"use a verified release ({', '.join(VERIFIED)}), or accept the risk with "
            "engine.allow_unverified_vllm: true / --allow-unverified-vllm")


def detect_vllm(dist: str = "vllm", allow_unverified: bool | None = None) -> VllmInfo:
    """The installed vLLM, from importlib.metadata (no import of vLLM itself)."""
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return VllmInfo(None, None, "vLLM is not installed in this Python environment")
    allow = allowed_by_env() if allow_unverified is None else allow_unverified
    return check_version(version, allow)


def shipped_facts() -> list[str]:
    """The releases whose facts ship with dsv4bisect, oldest first."""
    folder = resources.files(DATA_PACKAGE) / DATA_DIR
    names = sorted(p.name for p in folder.iterdir() if p.name.startswith("vllm-")
                   and p.name.endswith(".json"))
    found = [n[len("vllm-"):-len(".json")] for n in names]
    return sorted(found, key=lambda v: parse_version(v) or ())


@cache
def load_facts(release: str) -> dict[str, Any]:
    """The shipped source facts of a verified release (`plugin/vllm/facts.py` writes them).
    KeyError when none ships for it."""
    path = resources.files(DATA_PACKAGE) / DATA_DIR / f"vllm-{release}.json"
    if not path.is_file():
        raise KeyError(f"no vLLM facts ship for {release} (shipped: "
                       f"{', '.join(shipped_facts()) or 'none'})")
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != FACTS_SCHEMA or data.get("release") != release:
        raise KeyError(f"vllm-{release}.json is not facts schema {FACTS_SCHEMA} of {release}")
    return data



def fits(desc: dict[str, Any], value: Any, configs: dict[str, Any] | None = None) -> str | None:
    """Why a JSON `value` does not fit a TypeDesc of the shipped facts, or None. A TypeDesc has
    `kinds` (bool int float str bytes list dict none any config enum), `choices` only when
    every member is a Literal (a closed set) and `config` (the structured type's name). Coarse
    on purpose, as pydantic's lax mode: an int fits a float; a structured value is checked one
    level down against its config's fields when `configs` knows them."""
    kinds = set(desc.get("kinds", ()))
    if not kinds or "any" in kinds:
        return None
    if value is None:
        return None if "none" in kinds else "null is not allowed"
    choices = desc.get("choices")
    if choices is not None:
        return None if value in choices else \
            f"{value!r} is not one of {', '.join(map(repr, choices))}"
    if isinstance(value, bool):
        ok = "bool" in kinds
    elif isinstance(value, int):
        ok = bool(kinds & {"int", "float"})
    elif isinstance(value, float):
        ok = "float" in kinds
    elif isinstance(value, str):
        ok = bool(kinds & {"str", "bytes", "enum"})
    elif isinstance(value, list):
        ok = "list" in kinds
    elif isinstance(value, dict):
        ok = bool(kinds & {"dict", "config"})
        name = desc.get("config")
        fields = ((configs or {}).get(name) or {}).get("fields") if name else None
        if ok and "dict" not in kinds and fields is not None:
            unknown = sorted(set(value) - set(fields))
            if unknown:
                return f"{name} has no field {', '.join(unknown)}"
            for key, item in value.items():
                why = fits(fields[key]["type"], item, configs)
                if why is not None:
                    return f"{name}.{key}: {why}"
    else:
        ok = False
    return None if ok else f"{type(value).__name__} where {'|'.join(sorted(kinds))} is expected"
