"""What a micro-test run measures: patches, checkpoint, layers, contexts, device, activations.

Parsing of the command-line forms lives here (no torch): `PATCH[:VARIANT]` names,
`--layers SPEC` and `--contexts 1k,8k,32k,128k`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from dsv4bisect.errors import ConfigError
from dsv4bisect.microtest.runners import RUNNER_CHOICES

if TYPE_CHECKING:
    from dsv4bisect.reference.config import ModelArgs

DEFAULT_CONTEXTS = (1024, 8192, 32768, 131072)
_LAYER_HINT = ("--layers takes layer numbers, ranges and kinds, e.g. `0,2-4`, `csa`, `hash`, "
               "`last`, `all` or `auto` (the first layer of each kind, the first score-routed "
               "layer and the last layer)")


@dataclass(frozen=True)
class MicrotestSpec:
    """One micro-test run. `patches` maps name -> variant (empty: all six, default variants)."""

    patches: Mapping[str, str] = field(default_factory=dict)
    checkpoint: str = "embedded"
    layers: str = "auto"
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    device: str = "cpu"
    activations: str | None = None
    runners: tuple[str, ...] = RUNNER_CHOICES
    tokens: int = 32  # synthetic rows per check (query tokens, MoE tokens, stream rows)
    experts: int = 4  # routed experts sampled per layer (nvfp4-dispatch, trtllm-clamp)
    seed: int = 0
    # the MoE runner of the configuration under test: other runners' rows are contrast
    # (microtest/contrast.py); None: every runner measured counts
    deployed_runner: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "patches", MappingProxyType(dict(self.patches)))
        unknown = [r for r in self.runners if r not in RUNNER_CHOICES]
        if unknown or not self.runners:
            raise ConfigError(f"unknown MoE runner backend(s) {unknown or '(none)'}",
                              f"choose from {', '.join(RUNNER_CHOICES)}")
        if self.tokens < 1 or self.experts < 1:
            raise ConfigError("--tokens and --experts must be at least 1", "e.g. --tokens 16")

    def describe(self) -> dict[str, object]:
        return {"patches": dict(self.patches), "checkpoint": self.checkpoint,
                "layers": self.layers, "contexts": list(self.contexts), "device": self.device,
                "activations": self.activations, "runners": list(self.runners),
                "tokens": self.tokens, "experts": self.experts, "seed": self.seed,
                "deployed_runner": self.deployed_runner}


# The patches with an op of ours to measure (microtest/check_*.py). SGLang's own switches
# (fused mHC, TileLang indexer, ...) run SGLang's kernels, which only a bisect can judge.
MICROTESTED = ("mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer", "nvfp4-dispatch",
               "trtllm-clamp")


def parse_patches(names: Sequence[str]) -> dict[str, str]:
    """`["mhc-bf16", "mma-decode:merge-no-rescale"]` -> {name: variant} in registry order; no
    names -> every microtested patch with its default variant. Unknown names, and patches with
    nothing of ours to measure, are PatchErrors."""
    from dsv4bisect.errors import PatchError
    from dsv4bisect.patching.registry import builtin_patches, unknown_patch_hint
    from dsv4bisect.patching.wire import parse_patch_set

    known = builtin_patches()
    if not names:
        return {name: p.default_variant for name, p in known.items() if name in MICROTESTED}
    for raw in names:  # name the argument, not the wire format parse_patch_set reads
        name = raw.strip().partition(":")[0]
        if name not in known:
            hint = unknown_patch_hint(name, {n: None for n in MICROTESTED})
            raise PatchError(f"microtest argument `{raw}`: unknown patch `{name}`", hint)
    chosen = parse_patch_set(",".join(names), known)
    for name in chosen:
        if name not in MICROTESTED:
            raise PatchError(f"`{name}` has no microtest: it switches SGLang's own kernel",
                             "microtest measures our ops: " + ", ".join(MICROTESTED) +
                             f"; judge {name} with `dsv4bisect bisect` on SGLang")
    return chosen


def parse_contexts(text: str) -> tuple[int, ...]:
    """`1k,8k,32k,128k` -> (1024, 8192, 32768, 131072); plain numbers are tokens."""
    out: list[int] = []
    for raw in (t.strip().lower() for t in text.split(",")):
        m = re.fullmatch(r"(\d+)([km]?)", raw)
        if not m or int(m.group(1)) == 0:
            raise ConfigError(f"bad context length `{raw}` in --contexts `{text}`",
                              "use token counts such as 1k,8k,32k,128k or 4096")
        out.append(int(m.group(1)) * {"": 1, "k": 1024, "m": 1 << 20}[m.group(2)])
    return tuple(sorted(set(out)))


def resolve_layers(text: str, args: ModelArgs) -> tuple[int, ...]:
    """The decoder layers a --layers SPEC names for this model (sorted, no duplicates)."""
    n = args.num_hidden_layers
    kinds = {k: [i for i in range(n) if args.layer_kind(i) == k] for k in ("swa", "csa", "hca")}
    chosen: set[int] = set()
    for raw in (t.strip().lower() for t in text.split(",")):
        if raw in kinds:
            chosen.update(kinds[raw])
        elif raw == "all":
            chosen.update(range(n))
        elif raw == "hash":
            chosen.update(i for i in range(n) if args.is_hash_layer(i))
        elif raw == "last":
            chosen.add(n - 1)
        elif raw == "auto":
            score_routed = [i for i in range(n) if not args.is_hash_layer(i)]
            chosen.update(k[0] for k in kinds.values() if k)
            chosen.update(score_routed[:1])
            chosen.add(n - 1)
        else:
            chosen.update(_numbers(raw, n, text))
    if not chosen:
        raise ConfigError(f"--layers `{text}` selects no layer of this model", _LAYER_HINT)
    return tuple(sorted(chosen))


def _numbers(raw: str, n: int, text: str) -> range:
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", raw)
    if not m:
        raise ConfigError(f"bad layer item `{raw}` in --layers `{text}`", _LAYER_HINT)
    lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
    if lo > hi or hi >= n:
        raise ConfigError(f"layer `{raw}` out of range: this model has layers 0..{n - 1}",
                          _LAYER_HINT)
    return range(lo, hi + 1)
