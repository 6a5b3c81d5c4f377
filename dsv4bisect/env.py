"""Every environment variable dsv4bisect reads or sets, in one place."""

from __future__ import annotations

import os
from pathlib import Path

PATCHES = "DSV4BISECT_PATCHES"  # wire format, read by `serve` and the SGLang plugin
SWITCHES = "DSV4BISECT_SWITCHES"  # VAR=V,... the upstream switches as set (checked by the plugin)
ALLOW_UNVERIFIED_SGLANG = "DSV4BISECT_ALLOW_UNVERIFIED_SGLANG"  # 1: run on an unverified SGLang
ALLOW_UNVERIFIED_VLLM = "DSV4BISECT_ALLOW_UNVERIFIED_VLLM"  # 1: run on an unverified vLLM
RECEIPTS = "DSV4BISECT_RECEIPTS"  # directory where engine processes write receipts
ROLE = "DSV4BISECT_ROLE"  # the role of an engine process (server, prefill, decode)
LAUNCH = "DSV4BISECT_LAUNCH"  # names one spawn of an engine process (engines/groups.py)
SWITCH_DIR = "DSV4BISECT_SWITCH_DIR"  # hot mode: where switch requests and receipts live
HOT = "DSV4BISECT_HOT"  # hot mode: wire of the patches that may be switched in (bad variants)
# a PD server's transfer fault (engine.pd.transfer_fault; patching/transfer_faults.py)
PD_TRANSFER_FAULT = "DSV4BISECT_PD_TRANSFER_FAULT"
# a PD role's own patches on top of the profile's (engine.pd.<role>.patches), wire format: a hot
# switch of the profile's patches keeps them (reference/switch.py)
ROLE_PATCHES = "DSV4BISECT_ROLE_PATCHES"
CACHE = "DSV4BISECT_CACHE"  # cache root (worktrees, baselines, the ledger); default ~/.cache/dsv4bisect
# test-only patches (never in a real search): 1 registers the canary pair (patches/__init__.py);
# module,module registers those importable modules' patches after the built-ins (docs/patches.md)
TEST_PATCHES = "DSV4BISECT_TEST_PATCHES"
TEST_PATCH_MODULES = "DSV4BISECT_TEST_PATCH_MODULES"
SGLANG_PLUGINS = "SGLANG_PLUGINS"  # SGLang's whitelist of plugin entry points
VLLM_PLUGINS = "VLLM_PLUGINS"  # vLLM's allowlist of `vllm.general_plugins` entry points
PLUGIN_NAME = "dsv4bisect"

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def cache_dir() -> Path:
    root = os.environ.get(CACHE)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "dsv4bisect"


def is_secret(name: str) -> bool:
    upper = name.upper().replace("-", "_")
    return any(marker in upper for marker in SECRET_MARKERS)
