"""The declarative description of a patch: one frozen `Patch` per module in `patches/`.

A patch is data about a speed change: what it touches, how risky its numerics are, how each
engine kind receives it, which variants it has (fault variants reproduce known failure modes and
are labelled as faults everywhere), and the conditions under which it is inert or required.
The numerics themselves live where they run: the embedded engine's op swaps
(`dsv4bisect.reference`) and the SGLang hooks (`dsv4bisect.plugin`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# MoE runner backends whose NVFP4 path is the flashinfer TRT-LLM kernel.
TRTLLM_BACKENDS = frozenset({"flashinfer_trtllm", "flashinfer_trtllm_routed"})


@dataclass(frozen=True)
class EngineContext:
    """What a patch's conditions may look at; built from the resolved profile."""

    kind: str  # reference | sglang | command
    moe_backend: str | None = None
    sglang_version: tuple[int, ...] | None = None  # the deployment's SGLang, when known
    expert_quant: str | None = None  # routed experts as stored: nvfp4 | mxfp4 | fp8 | bf16


@dataclass(frozen=True)
class Condition:
    """A named predicate: `reason` is shown to the user whenever `when(ctx)` holds."""

    reason: str
    when: Callable[[EngineContext], bool]
    variants: tuple[str, ...] | None = None  # None: every variant

    def holds(self, ctx: EngineContext, variant: str) -> bool:
        return (self.variants is None or variant in self.variants) and bool(self.when(ctx))


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    fault: bool = False  # reproduces a known failure mode; for calibration and tests


@dataclass(frozen=True)
class SglangDelivery:
    """How the patch reaches a real SGLang deployment (through the `dsv4bisect` plugin)."""

    hooks: Mapping[str, tuple[str, ...]]  # SGLang layout ("0.5.13", "0.5.14") -> hook targets
    env: Mapping[str, str] = field(default_factory=dict)  # extra env for engine processes
    args: tuple[str, ...] = ()  # extra server args


@dataclass(frozen=True)
class Patch:
    """One speed patch. `variants[0]` is the default; `doc` is the module docstring."""

    name: str
    summary: str
    tier: int  # 1 = most likely culprit (every token, every layer) .. 3 = least
    touches: tuple[str, ...]
    reference: str  # the op the embedded engine swaps
    sglang: SglangDelivery
    variants: tuple[Variant, ...]
    inert_when: tuple[Condition, ...] = ()
    required_when: tuple[Condition, ...] = ()
    doc: str = ""
    test_only: bool = False

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError(f"patch {self.name} declares no variant")
        object.__setattr__(self, "sglang", _frozen_delivery(self.sglang))

    @property
    def default_variant(self) -> str:
        return self.variants[0].name

    def variant(self, name: str | None) -> Variant | None:
        name = name or self.default_variant
        return next((v for v in self.variants if v.name == name), None)

    def inert_reason(self, ctx: EngineContext, variant: str | None = None) -> str | None:
        v = variant or self.default_variant
        return next((c.reason for c in self.inert_when if c.holds(ctx, v)), None)

    def required_reason(self, ctx: EngineContext) -> str | None:
        v = self.default_variant
        return next((c.reason for c in self.required_when if c.holds(ctx, v)), None)


def _frozen_delivery(d: SglangDelivery) -> SglangDelivery:
    return SglangDelivery(
        hooks=MappingProxyType(dict(d.hooks)), env=MappingProxyType(dict(d.env)), args=tuple(d.args)
    )


def version_at_most(limit: tuple[int, ...]) -> Callable[[EngineContext], bool]:
    """Predicate: the deployment's SGLang version is known and <= `limit`."""
    return lambda ctx: ctx.sglang_version is not None and ctx.sglang_version <= limit


def version_at_least(limit: tuple[int, ...]) -> Callable[[EngineContext], bool]:
    return lambda ctx: ctx.sglang_version is not None and ctx.sglang_version >= limit
