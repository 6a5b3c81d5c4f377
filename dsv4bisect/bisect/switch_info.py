"""What a bisect needs to know of one candidate: its tier, its delivery, load-time or hot.

Patches answer from their resolved choice (patching/spec.py). Settings answer from the engine's
switch catalog: the embedded engine's (config/embedded_switches.py) or the SGLang release's
(patching/switch_catalog.py, read from the wheel); a switch neither names gets its tier from the
name rule below. The prior weight follows the tier (docs/bisect.md "Bisecting two
configurations"): kernel and precision choices are risk tier 1 (weight 2), topology and the
rest tier 2 (weight 1), scheduling and logging tier 3 (weight 0.5) — the same three weights
the patches' risk tiers have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dsv4bisect.bisect.setting_candidates import ARG, ENV, setting_kind
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.schema import Profile

# Prior weight per switch tier, on the patches' scale (risk tier 1: 2.0, 2: 1.0, 3: 0.5):
# kernel and precision choices are where the field regressions were traced (FP8 wo_a GEMM, FP4
# experts, the TileLang indexer), topology changes reductions and routing, scheduling changes
# numerics only by re-chunking or batching, logging should never.
SWITCH_WEIGHT = {"kernel": 2.0, "precision": 2.0, "topology": 1.0, "other": 0.5,
                 "scheduling": 0.5, "logging": 0.125}
RISK_OF_TIER = {"kernel": 1, "precision": 1, "topology": 2, "other": 2, "scheduling": 3,
                "logging": 3}
# The name rule, for a switch no catalog describes: first match wins, in this order.
NAME_TIERS = (
    ("logging", re.compile(r"LOG|METRIC|TRACE|PROFIL|DEBUG|VERBOS", re.I)),
    ("precision", re.compile(r"FP8|FP4|BF16|FP16|FP32|TF32|DTYPE|QUANT|PRECISION|SCALE", re.I)),
    ("kernel", re.compile(r"KERNEL|BACKEND|GEMM|FUSE|TILELANG|TRITON|DEEPGEMM|FLASHINFER|"
                          r"CUTLASS|MARLIN|CUDA.?GRAPH|MLA|ATTENTION|INDEXER|MHC|TOPK|"
                          r"SPECULATIVE|COMPILE", re.I)),
    ("topology", re.compile(r"(^|[-_.])(TP|DP|EP|PP|GPUS|NNODES|DISAGG\w*|"
                            r"ENABLE.DP.ATTENTION)($|[-_.])", re.I)),
    ("scheduling", re.compile(r"CHUNK|RUNNING|BATCH|RADIX|SCHEDUL|MEM.FRACTION|CACHE|"
                              r"MAX.MODEL.LEN|CONTEXT", re.I)),
)
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


def name_tier(name: str) -> str:
    for tier, pattern in NAME_TIERS:
        if pattern.search(name):
            return tier
    return "other"


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
    elif engine.kind == "sglang":
        found_tier = _sglang_tier(name, engine.sglang_version)
        if found_tier is not None:
            return found_tier, f"SGLang {engine.sglang_version}'s switch catalog"
    key = name[len(ENV):] if name.startswith(ENV) else name[len(ARG):] \
        if name.startswith(ARG) else name.rsplit(".", 1)[-1]
    return name_tier(key), "the name rule"


def _sglang_tier(name: str, release: str | None) -> str | None:
    """The release catalog's tier for an env switch or server flag (None: not in it)."""
    if release is None:
        return None
    try:
        from dsv4bisect.patching.switch_catalog import load_catalog
    except ImportError:  # the catalog ships with the switch discovery (issue 27 item 1)
        return None
    try:
        catalog = load_catalog(release)
    except Exception:  # noqa: BLE001 - a release without shipped data: the name rule
        return None
    for key in _catalog_names(name):
        found = catalog.by_name(key)
        if found is not None:
            return str(found.tier)
    return None


def _catalog_names(name: str) -> tuple[str, ...]:
    if name.startswith(ENV):
        return (name[len(ENV):],)
    key = name.rsplit(".", 1)[-1]
    flag = name[len(ARG):] if name.startswith(ARG) else SGLANG_FLAG.get(
        key, "--" + key.replace("_", "-"))
    return (flag, flag.lstrip("-"), flag.lstrip("-").replace("-", "_"))
