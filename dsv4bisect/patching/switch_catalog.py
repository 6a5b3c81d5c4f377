"""The switches an SGLang release reads on DeepSeek-V4's path, as shipped data (docs/sglang.md,
"Switch discovery").

`dsv4bisect.plugin.discover` finds them statically in a release's wheel (AST, no import); the
result for every verified release ships as `switch_data/sglang-<release>.json`, so a plan needs
no wheel. This module only reads and validates that data and classifies a switch's tier: pure,
no torch, no wheel. The JSON is

    {"release": "0.5.23", "switches": [{"name", "kind", "type", "default", "read", "hot",
                                        "gates", "where", "tier", "also", "other_vendor"}]}

`where` is the first read site, `also` every other one (`file:line`; written only when there
are others): together, every place the release reads the switch; `other_vendor` lists those of
them whose read happens, or matters, only on an AMD or Ascend GPU (behind `_is_hip`,
`is_npu()`, …). Together they say whose GPU path a switch acts on (bisect/switch_info.py
`other_vendor`).

`default` is the declared value, or an object `{"default": v, "sm120": v2, ...}` where the
release's source makes it depend on the GPU architecture (a platform-computed default, or a
server-args hook that sets it per architecture for DeepSeek-V4; `forced` then names the
architectures where SGLang sets it whatever the user asks).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dsv4bisect.errors import ConfigError, did_you_mean

Kind = Literal["env", "arg"]
Read = Literal["import", "construction", "call"]
Tier = Literal["kernel", "precision", "topology", "scheduling", "logging", "other"]
TIERS: tuple[str, ...] = ("kernel", "precision", "topology", "scheduling", "logging", "other")
READS: tuple[str, ...] = ("import", "construction", "call")  # earliest first
OPTIONAL = ("forced", "copies", "also", "other_vendor", "replaces")  # written only when not empty
DATA_PACKAGE = "dsv4bisect.patching"
DATA_DIR = "switch_data"


class Switch(BaseModel):
    """One switch: an env variable (`SGLANG_...`) or a server argument (`--kv-cache-dtype`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: Kind
    type: str  # bool | int | float | str | tuple | json | str|None ...
    default: Any  # JSON value, or {"default": v, "<arch>": v, ...} (module docstring)
    read: Read  # the earliest reading mode over its sites
    hot: bool  # read at every call at every site and deliverable through the switch file
    gates: str  # the function / class that reads it (first site; "+N" more)
    where: str  # "sglang/....py:LINE" of the first site (the declaration for an argument)
    tier: Tier
    forced: tuple[str, ...] = ()  # architectures where SGLang sets it unconditionally
    # `module.global`s the release copies it into at import and reads at every call: a hot
    # switch assigns them again (plugin/hot.py, `ImportCopy`)
    copies: tuple[str, ...] = ()
    also: tuple[str, ...] = ()  # the other read sites ("sglang/....py:LINE"), after `where`
    # the sites whose read happens, or matters, only on an AMD or Ascend GPU: behind `_is_hip`,
    # `is_npu()`, `_use_aiter`, … (`_is_hip and envs.X.get()`), or after `_is_cuda or`
    other_vendor: tuple[str, ...] = ()
    # names this setting had in earlier releases (vLLM: `--attention-config.indexer_kv_dtype`
    # replaces `--attention-config.use_fp4_indexer_cache`, docs/vllm.md)
    replaces: tuple[str, ...] = ()

    @property
    def sites(self) -> tuple[str, ...]:
        """Every place the release reads it: `where`, then `also`."""
        return (self.where, *self.also)

    def default_for(self, arch: str | None) -> Any:
        """The default on `arch` (sm120 | sm100 | sm90 | hip | npu), or the plain default."""
        if isinstance(self.default, Mapping) and "default" in self.default:
            return self.default.get(arch, self.default["default"]) if arch else \
                self.default["default"]
        return self.default


class SwitchCatalog(BaseModel):
    """Every switch one release reads on DeepSeek-V4's path, in a stable order (env first)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    release: str
    switches: tuple[Switch, ...]
    engine: str = "sglang"  # sglang | vllm (not written for SGLang: its files predate it)

    def by_name(self, name: str) -> Switch:
        """The switch called `name` (`--kv-cache-dtype` and `kv_cache_dtype` both work for an
        argument); a ConfigError naming the closest one when the release has none."""
        key = name if name.isupper() else arg_name(name)
        for switch in self.switches:
            if switch.name in (key, name):  # vLLM's dotted keys keep their underscores
                return switch
        hint = did_you_mean(key, self.names()) or "`dsv4bisect switches --json` lists them"
        raise ConfigError(f"{ENGINE_NAMES[self.engine]} {self.release} reads no switch `{name}` "
                          "on DeepSeek-V4's path", hint)

    def get(self, name: str) -> Switch | None:
        try:
            return self.by_name(name)
        except ConfigError:
            return None

    def names(self) -> list[str]:
        return [s.name for s in self.switches]

    def count(self, kind: str | None = None) -> int:
        return sum(1 for s in self.switches if kind is None or s.kind == kind)

    def to_json(self) -> dict[str, Any]:
        head = {"release": self.release} if self.engine == "sglang" else \
            {"engine": self.engine, "release": self.release}
        return {**head, "switches": [_switch_json(s) for s in self.switches]}


def _switch_json(switch: Switch) -> dict[str, Any]:
    out = switch.model_dump(mode="json")
    for optional in OPTIONAL:
        if not out[optional]:
            out.pop(optional)
    return out


def dumps(catalog: SwitchCatalog) -> str:
    """The shipped file's text: one switch per line, so a regenerated file diffs by switch."""
    rows = ",\n".join(json.dumps(row, sort_keys=False) for row in catalog.to_json()["switches"])
    engine = "" if catalog.engine == "sglang" else f'"engine": {json.dumps(catalog.engine)}, '
    return f'{{{engine}"release": {json.dumps(catalog.release)}, "switches": [\n{rows}\n]}}\n'


def arg_name(field: str) -> str:
    """`kv_cache_dtype` / `--kv-cache-dtype` -> `--kv-cache-dtype` (how a catalog names it)."""
    return "--" + field.lstrip("-").replace("_", "-")


def parse_catalog(data: Mapping[str, Any], origin: str) -> SwitchCatalog:
    try:
        return SwitchCatalog.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{origin}: not a switch catalog ({at}: {first['msg']})",
                          "regenerate it: python tests/benchmarks/gen_switch_catalog.py") from exc


ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


def shipped_releases(engine: str = "sglang") -> list[str]:
    """The releases whose catalog ships with dsv4bisect for `engine`, oldest first."""
    folder = resources.files(DATA_PACKAGE) / DATA_DIR
    names = [p.name for p in folder.iterdir() if p.name.endswith(".json")]
    found = [n[len(engine) + 1:-len(".json")] for n in names if n.startswith(f"{engine}-")]
    return sorted(found, key=_version_key)


def _version_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", release))


@cache
def load_catalog(release: str, engine: str = "sglang") -> SwitchCatalog:
    """The shipped catalog of `engine`'s `release`; ConfigError (exit 5) when none ships."""
    path = resources.files(DATA_PACKAGE) / DATA_DIR / f"{engine}-{release}.json"
    if not path.is_file():
        shipped = shipped_releases(engine)
        raise ConfigError(
            f"no switch catalog ships for {ENGINE_NAMES.get(engine, engine)} {release} "
            f"(shipped: {', '.join(shipped) or 'none'})",
            f"read it from the release itself: dsv4bisect switches --{engine}-src WHEEL|DIR")
    return parse_catalog(json.loads(path.read_text(encoding="utf-8")), f"{DATA_DIR}/{path.name}")


# --- tiers: a keyword rule over the name's words (docs/sglang.md, "Tiers") -----------------------
# First match wins, in this order: logging words mark a switch that only observes; precision
# words a number format; kernel words the implementation of an op; topology words the
# parallel layout; scheduling words batching, chunking, graphs and caches.
_TIER_WORDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("logging", frozenset({"LOG", "LOGGING", "DEBUG", "DUMP", "TRACE", "PRINT", "PROFILE",
                           "PROFILER", "METRICS", "VERBOSE", "CANARY", "RECORD", "WARN",
                           "SANITY", "CHECK", "ASSERT", "TIMING", "NVTX"})),
    ("precision", frozenset({"FP8", "FP4", "BF16", "FP16", "FP32", "DTYPE", "QUANT",
                             "QUANTIZATION", "DEQUANT", "MXFP4", "NVFP4", "MXFP", "INT8",
                             "INT4", "MXFP8", "Q8KV8", "MXSCALE", "SCALE", "PRECISION",
                             "E4M3", "E5M2", "UE8M0"})),
    ("kernel", frozenset({"BACKEND", "KERNEL", "KERNELS", "TILELANG", "DEEPGEMM", "TRITON",
                          "FLASHINFER", "FLASHMLA", "AITER", "CUTLASS", "TRTLLM", "CUTEDSL",
                          "JIT", "FUSE", "FUSED", "GEMM", "TOPK", "INDEXER", "COMPRESS",
                          "COMPRESSOR", "MHC", "HC", "ROPE", "NORM", "PRENORM", "SPARSE",
                          "FLYDSL", "ASM", "LAYOUT", "MLA", "EINSUM", "SINKHORN", "ALGORITHM",
                          "TORCH", "MEGA", "MQA", "LOGITS", "SPLIT", "HUMMING", "MARLIN"})),
    ("topology", frozenset({"TP", "DP", "EP", "PP", "CP", "DEEPEP", "A2A", "ALLREDUCE",
                            "ALLGATHER", "NCCL", "NNODES", "NODES", "RANKS", "EXPERTS",
                            "REDUNDANT", "DISAGGREGATION", "SPECULATIVE", "DRAFT", "MTP",
                            "EAGLE", "NEXTN"})),
    ("scheduling", frozenset({"CHUNK", "CHUNKED", "CUDA", "GRAPH", "GRAPHS", "BATCH", "BS",
                              "STREAM", "STREAMS", "OVERLAP", "SCHEDULE", "SCHEDULER", "MAX",
                              "MIN", "TOKENS", "RADIX", "CACHE", "PAGE",
                              "MEM", "MEMORY", "POOL", "WINDOW", "PAGED", "NONPAGED",
                              "COMPILE", "WARMUP", "QUEUE"})),
)


def tier_of(name: str) -> str:
    """The tier of a switch from the words of its name (env `SGLANG_OPT_FP8_WO_A_GEMM` or
    argument `--kv-cache-dtype`): the first tier in `_TIER_WORDS` one of whose words it has."""
    words = set(re.split(r"[_\-]+", name.strip("-").upper()))
    for tier, vocabulary in _TIER_WORDS:
        if words & vocabulary:
            return tier
    return "other"


# --- priors (issue 27 item 4): a switch's tier weighs its prior --------------------------------
# kernel / precision choices are where field regressions were traced (FP8 wo_a GEMM, FP4
# experts, TileLang indexer), topology changes reductions and routing, scheduling rarely changes
# numerics beyond re-chunking, logging never should. Ratios, not probabilities: `prior_weights`
# normalises them over the candidates at hand.
TIER_PRIOR: Mapping[str, float] = {"kernel": 4.0, "precision": 4.0, "topology": 2.0,
                                   "other": 1.0, "scheduling": 1.0, "logging": 0.25}


def tier_prior(tier: str) -> float:
    if tier not in TIER_PRIOR:
        raise ValueError(f"unknown tier {tier!r} (known: {', '.join(TIERS)})")
    return TIER_PRIOR[tier]


def prior_weights(switches: Iterable[Switch]) -> dict[str, float]:
    """Name -> prior probability of being the culprit, proportional to its tier's weight."""
    weights = {s.name: tier_prior(s.tier) for s in switches}
    total = sum(weights.values())
    return {name: w / total for name, w in weights.items()} if total else {}
