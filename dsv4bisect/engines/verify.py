"""After readiness: check that every requested patch took effect (a mismatch is an error).

The embedded engine reports its active patches in `/server_info`; SGLang processes write
receipts (one JSON record per patch and scheduler process) into the run's receipts directory.
"""

from __future__ import annotations

from typing import Any

import requests

from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.env import PATCHES
from dsv4bisect.errors import EngineError, PatchError
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patching.wire import parse_patch_set


def server_info(url: str) -> dict[str, Any]:
    for path in ("/server_info", "/get_server_info"):
        try:
            resp = requests.get(url + path, timeout=30)
        except requests.RequestException as exc:
            raise EngineError(f"GET {url}{path} failed: {exc}", "is the engine still up?") from exc
        if resp.status_code == 200:
            try:
                return dict(resp.json())
            except ValueError as exc:
                raise EngineError(f"{url}{path}: malformed JSON: {resp.text[:200]!r}",
                                  "the server is not SGLang-compatible") from exc
    raise EngineError(f"{url} has no /server_info", "the server is not SGLang-compatible")


def verify_reference_patches(cfg: EngineConfig, info: dict[str, Any]) -> None:
    """The embedded engine must report exactly the requested built-in patches and variants.
    A PD pair (its router's `/server_info` lists each server's): each server exactly the patch
    set its process was sent (the profile's with the role's own, DSV4BISECT_PATCHES)."""
    if isinstance(info.get("prefill"), list) and isinstance(info.get("decode"), list):
        for role in ("prefill", "decode"):
            sent = parse_patch_set(cfg.process(role).env_dict().get(PATCHES, ""),
                                   builtin_patches())
            for server in info[role]:
                _same_patches(sent, server, f"the {role} server")
        return
    _same_patches({p.name: p.variant for p in cfg.patches if p.builtin}, info, "the engine")


def _same_patches(requested: dict[str, str], info: Any, who: str) -> None:
    active = info.get("patches") if isinstance(info, dict) else None
    if not isinstance(active, dict):
        raise PatchError(f"{who}'s /server_info reports no `patches`",
                         "is this the dsv4bisect embedded engine?")
    if active != requested:
        raise PatchError(
            f"requested patches did not take effect: requested {requested or 'none'}, "
            f"{who} reports {active or 'none'}",
            "a patch that does not take effect would make the trial a silent pass",
        )
