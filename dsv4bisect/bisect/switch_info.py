"""What a bisect needs to know of one candidate: its tier, its delivery, load-time or hot.

Patches answer from their resolved choice (patchspec/spec.py). Settings answer from the engine's
switch catalog: the embedded engine's (config/embedded_switches.py) or the SGLang release's
(patching/switch_catalog.py, read from the wheel); a switch neither names gets its tier from the
catalog's word rule over its name (`tier_of`). The prior weight follows the tier
(`SWITCH_WEIGHT`; docs/bisect.md "Bisecting two configurations").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dsv4bisect.bisect.setting_candidates import ARG, ENV, setting_kind
from dsv4bisect.config.schema import Profile
from dsv4bisect.errors import ConfigError
from dsv4bisect.patching.switch_catalog import TIER_PRIOR, Switch, load_catalog, tier_of

# Prior weight per switch tier, on the patches' scale (risk tier 1: 2.0, 2: 1.0, 3: 0.5): the
# switch catalog's tier ratios (kernel and precision 4, topology 2, other and scheduling 1,
# logging 0.25: patching/switch_catalog.py, TIER_PRIOR) halved, so a kernel switch weighs as a
# risk-1 patch.
SWITCH_WEIGHT = {tier: w / 2 for tier, w in TIER_PRIOR.items()}
RISK_OF_TIER = {"kernel": 1, "precision": 1, "topology": 2, "other": 2, "scheduling": 3,
                "logging": 3}
# Where an `engine` key of an SGLang profile goes: its server flag (config/processes.py).
SGLANG_FLAG = {"moe_backend": "--moe-runner-backend", "quantization": "--quantization",
               "chunked_prefill_size": "--chunked-prefill-size", "tp": "--tp", "dp": "--dp",
               "max_running_requests": "--max-running-requests",
               "disable_radix_cache": "--disable-radix-cache"}
SETTING_LOAD_TIME = {
    "env": "an environment variable is read when the engine starts",
    "arg": "a server flag is read when the engine starts",
    "key": "a launch setting (its flags are read when the engine starts)"}


@dataclass(frozen=True)
class SwitchInfo:
    tier: str  # kernel | precision | topology | scheduling | logging | other
    risk: int  # the prior's risk tier (1 heaviest .. 3)
    delivery: str  # how B's value reaches the engine
    load_time: str | None  # why switching it needs a fresh launch; None: hot
    inert: str | None = None  # why it cannot change anything here
    source: str = ""  # where the tier came from: catalog (which) or the name rule

    @property
    def weight(self) -> float:
        """The prior weight of its tier: SWITCH_WEIGHT (a patch's comes from its risk tier)."""
        return SWITCH_WEIGHT[self.tier]


def describe(name: str, value: str, profile: Profile, patches: dict[str, Any]) -> SwitchInfo:
    """`patches`: the resolved patch choices of the end that has `name` on (bad, else good)."""
    if name in patches:
        choice = patches[name]
        return SwitchInfo("kernel", choice.tier, choice.delivery or "hook", choice.load_time,
                          choice.inert, f"a patch of risk tier {choice.tier}")
    kind = setting_kind(name)
    delivery = (f"env {name[len(ENV):]}={value}" if kind == "env" else
                f"arg {name[len(ARG):]} {value}".rstrip() if kind == "arg" else
                f"profile {name}={value}")
    tier, source = _catalog_tier(name, profile)
    return SwitchInfo(tier, RISK_OF_TIER[tier], delivery, SETTING_LOAD_TIME[kind], None, source)


def _catalog_tier(name: str, profile: Profile) -> tuple[str, str]:
    engine = profile.engine
    if engine.kind == "reference":
        from dsv4bisect.config.embedded_switches import embedded_switch

        found = embedded_switch(name)
        if found is not None:
            return found.tier, "the embedded engine's catalog"
    elif engine.kind in ("sglang", "vllm"):
        release = engine.vllm_version if engine.kind == "vllm" else engine.sglang_version
        found_tier = _release_tier(name, release, engine.kind)
        if found_tier is not None:
            label = "vLLM" if engine.kind == "vllm" else "SGLang"
            return found_tier, f"{label} {release}'s switch catalog"
    key = name[len(ENV):] if name.startswith(ENV) else name[len(ARG):] \
        if name.startswith(ARG) else name.rsplit(".", 1)[-1]
    return tier_of(key), "the name rule"


def _release_tier(name: str, release: str | None, engine: str = "sglang") -> str | None:
    """The release catalog's tier for an env switch or server flag (None: not in it)."""
    if release is None:
        return None
    try:
        catalog = load_catalog(release, engine)
    except ConfigError:  # no catalog ships for it: the name rule
        return None
    for key in _catalog_names(name, engine):
        found = catalog.get(key)
        if found is not None:
            return str(found.tier)
    return None


# A switch whose name says it belongs to an AMD (HIP, ROCm, AITER) or Ascend (NPU) path.
OTHER_VENDOR = re.compile(r"(^|_)(HIP|ROCM|NPU|AITER)(_|$)")
# A source file of another vendor's path: `fp4_indexer_hip.py`, `deepseek_v4_backend_hip_radix.py`,
# `models/deepseek_common/amd/…`, `…_gfx95_dense.py`, `hardware_backend/npu/…`.
OTHER_VENDOR_FILE = re.compile(r"(^|[/_.])(hip|rocm|amd|aiter|npu|ascend|gfx\d+)([/_.]|$)")


def other_vendor(name: str, arch: str, switch: Switch | None = None) -> str | None:
    """Why an AMD or Ascend path's switch cannot act on an NVIDIA GPU (None: it can).

    `switch`: the release's catalog entry, which has every site the release reads it at and
    those behind another vendor's platform test (`_is_hip and envs.X.get()`; plugin/discover.py).
    Read where: a switch every read of which is in another vendor's files or behind its test
    is dropped whatever its name (SGLANG_DSV4_FP4_LOGITS_BUDGET_MB: read only in
    fp4_indexer_hip.py); one read anywhere else stays a candidate, even with HIP in its name.
    Without a catalog entry the name decides (a switch named for HIP, ROCm, AITER or NPU)."""
    if not arch.startswith("sm"):
        return None
    if switch is None:
        if OTHER_VENDOR.search(name.lstrip("-").upper().replace("-", "_")):
            return f"named for an AMD/NPU path (no catalog entry says where it is read): not " \
                   f"read on {arch}"
        return None
    by_file = [s for s in switch.sites if OTHER_VENDOR_FILE.search(s.rsplit(":", 1)[0].lower())]
    behind = [s for s in switch.sites if s in switch.other_vendor and s not in by_file]
    if len(by_file) + len(behind) < len(switch.sites):
        return None
    said = []
    if by_file:
        said.append("in AMD/NPU code (" + _files(by_file) + ")")
    if behind:
        said.append("behind an AMD/NPU platform test (" + _files(behind, lines=True) + ")")
    return f"read only {' and '.join(said)}: not read on {arch}"


def _files(sites: list[str], *, lines: bool = False) -> str:
    shown = [s.rsplit("/", 1)[-1] if lines else s.rsplit(":", 1)[0].rsplit("/", 1)[-1]
             for s in sites]
    shown = list(dict.fromkeys(shown))
    return ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")


def catalog_switch(name: str, profile: Profile) -> Switch | None:
    """The profile's SGLang or vLLM release's catalog entry for this variable or flag (None:
    the catalog does not list it, or the profile runs no pinned SGLang or vLLM)."""
    engine = profile.engine
    release = engine.vllm_version if engine.kind == "vllm" else engine.sglang_version
    if engine.kind not in ("sglang", "vllm") or not release:
        return None
    try:
        return load_catalog(release, engine.kind).get(name)
    except ConfigError:
        return None


def in_catalog(switch: str, profile: Profile) -> bool:
    """Whether the SGLang or vLLM release's catalog lists this variable or flag (read on V4's
    path)."""
    return catalog_switch(switch, profile) is not None


# Where an `engine` key of a vLLM profile goes (config/processes.py `_vllm_server`).
VLLM_FLAG = {"moe_backend": "--moe-backend", "quantization": "--quantization",
             "chunked_prefill_size": "--max-num-batched-tokens", "tp": "--tensor-parallel-size",
             "dp": "--data-parallel-size", "max_running_requests": "--max-num-seqs",
             "disable_radix_cache": "--enable-prefix-caching"}


def _catalog_names(name: str, engine: str = "sglang") -> tuple[str, ...]:
    if name.startswith(ENV):
        return (name[len(ENV):],)
    key = name.rsplit(".", 1)[-1]
    flags = VLLM_FLAG if engine == "vllm" else SGLANG_FLAG
    flag = name[len(ARG):] if name.startswith(ARG) else flags.get(
        key, "--" + key.replace("_", "-"))
    if engine == "vllm" and flag.startswith("--no-"):
        flag = "--" + flag[5:]  # a boolean option's negative form
    return (flag, flag.lstrip("-"), flag.lstrip("-").replace("-", "_"))
