"""The declarative description of a patch: one frozen `Patch` per module in `patches/`.

A patch is data about a speed change: what it touches, how risky its numerics are, how each
engine kind receives it, which variants it has (fault variants reproduce known failure modes and
are labelled as faults everywhere), and the conditions under which it is inert or required.
It also points, as typed references, to the code that acts for it on each engine kind: the ops
it swaps in on the embedded engine (`swaps`, `patchspec/swaps.py`) and its hook planner per
engine kind that hooks (`planners`: SGLang's and vLLM's, beside their deliveries `sglang` and
`vllm`). docs/patches.md says how to add a patch, a fault variant
or a planner for another engine kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsv4bisect.patchspec.plan import Planner
    from dsv4bisect.patchspec.swaps import Swap

# MoE runner backends whose NVFP4 path is the flashinfer TRT-LLM kernel.
TRTLLM_BACKENDS = frozenset({"flashinfer_trtllm", "flashinfer_trtllm_routed"})


@dataclass(frozen=True)
class EngineContext:
    """What a patch's conditions may look at; built from the resolved profile."""

    kind: str  # reference | sglang | vllm | command
    moe_backend: str | None = None
    sglang_version: tuple[int, ...] | None = None  # the deployment's SGLang, when known
    expert_quant: str | None = None  # routed experts as stored: nvfp4 | mxfp4 | fp8 | bf16
    gpu_arch: str | None = None  # sm120 | sm100 | sm90 (the profile's engine.gpu_arch)
    vllm_version: tuple[int, ...] | None = None  # kind vllm: the deployment's vLLM, when known


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
    # A fault from the field: the issue or PR it models, and how the real bug showed (where,
    # at what size); "" for the faults of our own invention and for real variants.
    citation: str = ""
    showed: str = ""


ARCHS = ("sm120", "sm100", "sm90")
# A hook on one of these runs while the model is built or its weights are processed: what it
# changes is fixed for the life of the engine (a patch hooked there is not hot-switchable).
LOAD_TIME_METHODS = frozenset({"__init__", "process_weights_after_loading", "get_quant_method"})
HOW = ("hook", "env", "args", "upstream", "absent")  # how "on" reaches a release × arch


@dataclass(frozen=True)
class ImportCopy:
    """A module global that the release sets once from an upstream switch at import
    (`name = envs.VAR.get()` at module level of `module`) and then reads at every call: a hot
    switch sets `os.environ[VAR]` and assigns the global again, evaluating the same
    `envs.VAR.get()` through the module's own `envs` (what a fresh import would do)."""

    module: str  # dotted module path, e.g. sglang.kernels.ops.attention.flash_mla_sm120
    name: str  # the module global, e.g. _sm120_default_backend
    var: str  # the switch's env var

    @property
    def target(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class SglangRule:
    """How the patch's "on" reaches SGLang releases `since`..`until` (inclusive; None: open) on
    GPU architectures `archs`: `hook` (our plugin's hooks), `env` (an upstream switch: `on` /
    `off` env, `{variant}` is replaced by the variant's name), `args` (SGLang server arguments,
    the delivery's `args`: read at launch, never through the plugin), `upstream` (upstream default, not
    switchable: never a candidate) or `absent` (the release has no such path on these GPUs).
    `off` is the most exact path that release has; `evidence` points at that release's source."""

    since: tuple[int, ...]
    until: tuple[int, ...] | None
    how: str
    evidence: str
    archs: tuple[str, ...] = ARCHS
    on: Mapping[str, str] = field(default_factory=dict)
    off: Mapping[str, str] = field(default_factory=dict)
    # Where an `env` switch is read: "" = at every call (the plugin can flip it in a running
    # engine), else the evidence that the release reads it once (import, __init__, weight
    # processing), so changing it needs a fresh launch.
    read_once: str = ""
    # Module globals the release copies the switch into at import and reads per call; only
    # with `read_once` unset (the copy is what the plugin re-assigns at a hot switch).
    copies: tuple[ImportCopy, ...] = ()

    def __post_init__(self) -> None:
        if self.how not in HOW:
            raise ValueError(f"unknown delivery {self.how!r}")
        if self.copies and (self.read_once or self.how != "env"):
            raise ValueError("copies are for a per-call env switch (how='env', no read_once)")
        if any(c.var not in self.variables for c in self.copies):
            raise ValueError("a copy must be of one of the rule's own switch variables")
        object.__setattr__(self, "on", MappingProxyType(dict(self.on)))
        object.__setattr__(self, "off", MappingProxyType(dict(self.off)))

    def covers(self, version: tuple[int, ...], arch: str | None) -> bool:
        v = version[:4]
        return (v >= self.since and (self.until is None or v <= self.until)
                and (arch is None or arch in self.archs))

    @property
    def variables(self) -> frozenset[str]:
        return frozenset(self.on) | frozenset(self.off)

    def on_env(self, variant: str) -> dict[str, str]:
        return {k: v.replace("{variant}", variant) for k, v in self.on.items()}


@dataclass(frozen=True)
class Mask:
    """While patch `by` is on (and not itself inert), this patch's "on" cannot take effect."""

    by: str
    reason: str


@dataclass(frozen=True)
class CallContract:
    """A call in SGLang's source the hook relies on: `callee(...)` inside `module[.within]`
    passes these keywords (exactly, or at least), and with `index` set the caller uses only
    `result[index]`."""

    module: str
    within: str | None
    callee: str
    keywords: frozenset[str]
    index: int | None = None
    why: str = ""
    exact: bool = True  # False: these keywords at least


@dataclass(frozen=True)
class SglangDelivery:
    """How the patch reaches a real SGLang deployment (through the `dsv4bisect` plugin)."""

    hooks: Mapping[str, tuple[str, ...]]  # SGLang hook layout (versions.LAYOUTS) -> targets
    env: Mapping[str, str] = field(default_factory=dict)  # extra env for engine processes
    args: tuple[str, ...] = ()  # extra server args
    rules: tuple[SglangRule, ...] = ()  # per release range × arch; none: a hook everywhere
    # layout -> SGLang symbols the hook bodies import or call at call time: checked like the
    # hook targets, so a moved one is refused at install (and failed by doctor) instead of
    # crashing the scheduler at the first forward
    uses: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # layout -> the calls in that layout's SGLang source the hooks rely on (static checks)
    calls: Mapping[str, tuple[CallContract, ...]] = field(default_factory=dict)

    def rule(self, version: tuple[int, ...] | None, arch: str | None) -> SglangRule | None:
        if version is None:
            return None
        return next((r for r in self.rules if r.covers(version, arch)), None)


@dataclass(frozen=True)
class VllmSite:
    """A vLLM hook target (`module.function` or `module.Class.method`) and, for a module-level
    function, the modules that did `from module import function`: their by-value copy is
    rebound too (a rebinding in the defining module alone would never be called)."""

    target: str
    copies: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.target.rsplit(".", 1)[-1]

    @property
    def module(self) -> str:
        return self.target.rsplit(".", 1)[0]


@dataclass(frozen=True)
class VllmCall:
    """A call in vLLM's source a hook relies on: `callee(...)` inside `module[.within]` with
    these keywords (at least), no positional argument when `keywords_only`."""

    module: str
    within: str
    callee: str
    keywords: frozenset[str]
    why: str
    keywords_only: bool = True


VLLM_HOW = ("hook", "args", "absent")


def _never_inert(variant: str, ctx: EngineContext) -> str | None:
    return None


@dataclass(frozen=True)
class VllmDelivery:
    """How the patch's "on" reaches a vLLM deployment: `hook` (the plugin installs the hooks of
    `Planners.vllm` in every worker), `args` (on `vllm serve`'s command line) or `absent` (vLLM
    has no such path, or dsv4bisect no hook for it), with the `evidence` read from the
    verified releases. Per vLLM hook layout (`base/vllm_releases.LAYOUTS`), as `SglangDelivery`
    per SGLang layout: the sites the hooks replace, the vLLM symbols the hook bodies call at
    run time (checked like the sites) and the calls in vLLM's source they rely on."""

    how: str
    evidence: str
    # variant, deployment -> why "on" changes nothing there (then it is not sent to vLLM)
    inert: Callable[[str, EngineContext], str | None] = _never_inert
    args: tuple[str, ...] = ()
    variants: tuple[str, ...] | None = None  # None: every variant; else the only ones delivered
    sites: Mapping[str, tuple[VllmSite, ...]] = field(default_factory=dict)
    uses: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    calls: Mapping[str, tuple[VllmCall, ...]] = field(default_factory=dict)
    # the receipt's one evidence key where the sites of a layout are alternatives of one op
    # (the model calls some of them, which ones depends on the layer): one call of any suffices
    any_site: str = ""

    def __post_init__(self) -> None:
        if self.how not in VLLM_HOW:
            raise ValueError(f"unknown vLLM delivery {self.how!r}")
        if bool(self.args) != (self.how == "args"):
            raise ValueError("a vLLM delivery has server arguments exactly when how='args'")
        for name in ("sites", "uses"):
            object.__setattr__(self, name, MappingProxyType(
                {k: tuple(v) for k, v in getattr(self, name).items()}))
        object.__setattr__(self, "calls", MappingProxyType(
            {k: tuple(v) for k, v in self.calls.items() if v}))
        object.__setattr__(self, "args", tuple(self.args))

    def evidence_key(self, layout: str) -> str | None:
        """The receipt's single evidence key where this layout's sites are alternatives."""
        return self.any_site if self.any_site and len(self.sites.get(layout, ())) > 1 else None

    def reaches(self, patch: str, variant: str, ctx: EngineContext
                ) -> tuple[str, bool, str | None]:
        """(how "on" reaches vLLM, whether it is sent to the engine, why it changes nothing)."""
        if self.how == "absent":
            return "absent", False, self.evidence
        if self.variants is not None and variant not in self.variants:
            return self.how, False, (f"{patch}:{variant} has no vLLM delivery (a fault the "
                                     "embedded engine models, or a variant vLLM cannot express)")
        inert = self.inert(variant, ctx)
        if inert is not None:
            return "upstream" if self.how == "hook" else self.how, False, inert
        if self.how == "args":
            return "args " + " ".join(self.args), True, None
        return "hook", True, None


NO_VLLM = VllmDelivery("absent", "no vLLM delivery declared")


@dataclass(frozen=True)
class Planners:
    """The patch's hook planner per engine kind that is patched by hooks: called in each
    engine process with (variant, layout, recorder), it returns the `Plan` of hooks to install
    (`patchspec/plan.py`). None: nothing to hook on that kind (an upstream switch or server
    arguments deliver the patch there, or it is refused). Another engine kind is one more
    field here (and a delivery type beside `SglangDelivery`, `VllmDelivery`) and one more
    argument in the patches that have a planner for it."""

    sglang: Planner | None = None
    vllm: Planner | None = None  # exactly where the patch's `vllm` delivery is a hook


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
    vllm: VllmDelivery = NO_VLLM  # how it reaches vLLM (absent unless declared)
    inert_when: tuple[Condition, ...] = ()
    required_when: tuple[Condition, ...] = ()
    masked_by: tuple[Mask, ...] = ()  # other patches whose "on" keeps this one from acting
    embedded: str = ""  # what the embedded engine does for it, where that is not `reference`
    # Why its effect is fixed when the engine loads, on every engine kind (quant-method
    # dispatch, weights derived after loading); "" = decided at call time (hot-switchable).
    load_time: str = ""
    doc: str = ""
    test_only: bool = False
    # The ops its variants swap on the embedded engine (`patchspec/swaps.py`), and its hook
    # planner per engine kind: typed references into code that imports torch only when it runs.
    swaps: tuple[Swap, ...] = ()
    planners: Planners = field(default_factory=Planners)

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError(f"patch {self.name} declares no variant")
        names = {v.name for v in self.variants}
        stray = [v for s in self.swaps for v in (s.variants or ()) if v not in names]
        if stray:
            raise ValueError(f"patch {self.name} swaps ops for unknown variants {stray}")
        if (self.planners.vllm is not None) != (self.vllm.how == "hook"):
            raise ValueError(f"patch {self.name}: a vLLM planner goes with a `hook` delivery")
        object.__setattr__(self, "sglang", _frozen_delivery(self.sglang))
        object.__setattr__(self, "swaps", tuple(self.swaps))

    @property
    def reference_modelled(self) -> bool:
        """False where the embedded engine has no numerics for it (`embedded` says so)."""
        return not self.embedded.startswith("not modelled")

    @property
    def default_variant(self) -> str:
        return self.variants[0].name

    def variant(self, name: str | None) -> Variant | None:
        name = name or self.default_variant
        return next((v for v in self.variants if v.name == name), None)

    def inert_reason(self, ctx: EngineContext, variant: str | None = None) -> str | None:
        v = variant or self.default_variant
        if ctx.kind == "sglang":
            rule = self.sglang.rule(ctx.sglang_version, ctx.gpu_arch)
            if rule is not None and rule.how in ("upstream", "absent"):
                return rule.evidence
        return next((c.reason for c in self.inert_when if c.holds(ctx, v)), None)

    def load_time_reason(self, ctx: EngineContext) -> str | None:
        """Why switching this patch needs a fresh launch here; None: it can be switched inside
        a running engine (its effect is decided at call time). docs/hot-switching.md."""
        if self.load_time:
            return self.load_time
        if ctx.kind not in ("reference", "sglang"):
            return f"a `{ctx.kind}` engine has no switch protocol"
        if ctx.kind == "sglang":
            rule = self.sglang.rule(ctx.sglang_version, ctx.gpu_arch)
            if rule is not None and rule.how == "env" and rule.read_once:
                return rule.read_once
            if (rule is None or rule.how == "hook") and ctx.sglang_version is not None:
                from dsv4bisect.base.versions import layout_of_range

                targets = self.sglang.hooks.get(layout_of_range(ctx.sglang_version), ())
                at_load = [t for t in targets if t.rsplit(".", 1)[-1] in LOAD_TIME_METHODS]
                if at_load:
                    return f"its hook acts in {at_load[0]}, which runs while the model loads"
        return None

    def required_reason(self, ctx: EngineContext) -> str | None:
        v = self.default_variant
        return next((c.reason for c in self.required_when if c.holds(ctx, v)), None)


def _frozen_delivery(d: SglangDelivery) -> SglangDelivery:
    return SglangDelivery(
        hooks=MappingProxyType(dict(d.hooks)), env=MappingProxyType(dict(d.env)),
        args=tuple(d.args), rules=tuple(d.rules), uses=MappingProxyType(dict(d.uses)),
        calls=MappingProxyType({k: tuple(v) for k, v in d.calls.items()}),
    )


def by_layout(**changes: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Hook targets per layout from the layouts where they change: `by_layout(l0_5_13=(..),
    l0_5_16=(..))` gives every layout the targets of the newest change at or before it."""
    from dsv4bisect.base.versions import LAYOUTS

    given = {k[1:].replace("_", "."): v for k, v in changes.items()}
    out: dict[str, tuple[str, ...]] = {}
    current: tuple[str, ...] = ()
    for layout in LAYOUTS:
        current = given.get(layout, current)
        out[layout] = current
    return out


def version_at_most(limit: tuple[int, ...]) -> Callable[[EngineContext], bool]:
    """Predicate: the deployment's SGLang version is known and <= `limit` (a post release of
    `limit` included: 0.5.13.post1 is at most 0.5.13)."""
    return lambda ctx: (ctx.sglang_version is not None
                        and ctx.sglang_version[:len(limit)] <= limit)


def version_at_least(limit: tuple[int, ...]) -> Callable[[EngineContext], bool]:
    return lambda ctx: (ctx.sglang_version is not None
                        and ctx.sglang_version[:len(limit)] >= limit)
