"""Install the hooks of a patch set in this SGLang process and write one receipt per patch.

Order per patch: plan (variant × layout) → resolve every target (importing its module, as
SGLang's `HookRegistry` would) and check its signature against `targets.SIGNATURES` → the
patch's own check (e.g. a kernel path that would bypass the hook) → register with
`HookRegistry` and apply at once, so the receipt states what really happened (SGLang's
`apply_hooks` logs and skips a failing target; applying here lets us see that). A patch whose
layout is unknown, whose target is missing or changed, or whose hooks fail is `refused` /
`failed`, never silently skipped. Torch is imported only by the hook modules.
"""

from __future__ import annotations

import inspect
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from dsv4bisect.base.versions import SglangInfo
from dsv4bisect.patchspec.plan import HookSpec, Plan, Planner, Recorder
from dsv4bisect.patchspec.spec import Patch
from dsv4bisect.plugin.receipts import Receipt, ReceiptWriter
from dsv4bisect.sglang_hooks.targets import CONTRACT_TARGET, SIGNATURES, Signature

CONTRACT = "routed-scaling-contract"


class _Rec:
    """A patch's view of the receipt writer (what its hooks may report)."""

    def __init__(self, writer: ReceiptWriter, patch: str) -> None:
        self.writer, self.patch = writer, patch

    def called(self, target: str) -> None:
        self.writer.mark_called(self.patch, target)

    def log(self, key: str, value: Any) -> None:
        self.writer.update_detail(self.patch, key, value)


def planner(patch: Patch, switch: frozenset[str] = frozenset()) -> Planner:
    """The patch's own SGLang planner, or (an upstream switch) the check of the value SGLang
    kept for the switch's variables."""
    if patch.planners.sglang is not None:
        return patch.planners.sglang
    from dsv4bisect.plugin.hooks_switch import planner as switch_planner

    return switch_planner(switch)


def switch_variables(patch: Patch, version: tuple[int, ...] | None) -> frozenset[str]:
    """The env vars of an upstream-switch patch on this release (any GPU)."""
    if version is None:
        return frozenset()
    return frozenset().union(*(r.variables for r in patch.sglang.rules
                               if r.how == "env" and r.covers(version, None)))


PlanFor = Callable[[str, str, frozenset[str], Recorder], Plan]


def install_patches(patches: Mapping[str, str], info: SglangInfo, writer: ReceiptWriter,
                    known: Mapping[str, Patch], plan_for: PlanFor | None = None,
                    contract: bool = True) -> list[Receipt]:
    """Install each patch (name -> variant) of `known` (the registry). `plan_for(name,
    variant, switch, recorder)` replaces the patch's own planner (hot mode:
    `dsv4bisect.plugin.hot` plans gated hooks); `contract` installs the contract observer."""
    receipts = []
    for name, variant in patches.items():
        patch = known[name]
        targets = list(patch.sglang.hooks.get(info.layout or "", ()))
        base = dict(patch=name, variant=variant, process=writer.process,
                    sglang_version=info.version, layout=info.layout, targets=targets)
        # an upstream switch's variables on this release (hook patches have a planner)
        hooked = patch.planners.sglang is not None
        switch = frozenset() if hooked else switch_variables(patch, info.version_tuple)
        if info.layout is None:
            rec = Receipt(**base, state="refused", reason=info.reason or "unknown SGLang layout")
        elif not hooked and not switch:
            rec = Receipt(**base, state="refused", reason=f"no SGLang delivery for patch {name} "
                          f"on SGLang {info.version}")
        else:
            recorder = _Rec(writer, name)
            plan = (plan_for(name, variant, switch, recorder) if plan_for is not None
                    else planner(patch, switch)(variant, info.layout, recorder))
            rec = _install_one(base, plan, info.layout, writer,
                               patch.sglang.uses.get(info.layout, ()))
        writer.write(rec)
        receipts.append(rec)
    if contract and patches and info.layout is not None:
        receipts.append(install_contract(info, writer, patches))
    return receipts


def _install_one(base: dict[str, Any], plan: Plan, layout: str, writer: ReceiptWriter,
                 uses: tuple[str, ...]) -> Receipt:
    notes = list(plan.notes)
    if plan.action != "install":
        state = "inert" if plan.action == "inert" else "refused"
        return Receipt(**base, state=state, reason=plan.reason, notes=notes)
    stray = [h.target for h in plan.hooks if h.target not in base["targets"]]
    if stray:
        return Receipt(**base, state="refused", notes=notes,
                       reason=f"hook targets not declared by the patch: {', '.join(stray)}")
    problem = check_targets([h.target for h in plan.hooks] + list(uses), layout)
    if problem is None and plan.check is not None:
        problem = plan.check()
    if problem is not None:
        return Receipt(**base, state="refused", reason=problem, notes=notes)
    # Register the receipt first: hooks may report calls while being applied.
    rec = Receipt(**base, state="installed", notes=notes,
                  expects_call=[h.target for h in plan.hooks if h.on_path])
    writer.write(rec)
    if not plan.hooks:
        return rec
    try:
        rec.hooks = apply_hooks(plan.hooks)
    except Exception as exc:  # noqa: BLE001 - any failure is written down, not raised
        rec.state, rec.reason = "failed", f"{type(exc).__name__}: {exc}"
    return rec


def check_targets(targets: list[str], layout: str,
                  table: Mapping[str, Signature] | None = None) -> str | None:
    """Resolve each target and compare its signature with the layout's table (`table`:
    another engine's, e.g. vLLM's `vllm_hooks/targets.SIGNATURES[layout]`)."""
    table = SIGNATURES[layout] if table is None else table
    for target in targets:
        sig = table.get(target)
        if sig is None:
            return f"{target} has no expected signature for layout {layout}"
        try:
            obj = resolve(target)
        except (ImportError, AttributeError, ValueError) as exc:
            return f"cannot resolve {target}: {type(exc).__name__}: {exc}"
        names = signature_names(obj)
        if names is not None and sig.params and (why := sig.mismatch(names)):
            return f"{target} changed: {why}"
    return None


def resolve(target: str) -> Any:
    obj_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(obj_path)
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__
    return getattr(owner, attr)


def signature_names(obj: Any) -> tuple[str, ...] | None:
    fn = inspect.unwrap(obj)  # a target hooked by another plugin: check the original
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None  # a builtin/extension function: nothing to compare


def apply_hooks(hooks: tuple[HookSpec, ...]) -> list[dict[str, Any]]:
    """Register with SGLang's HookRegistry and apply now; verify each target changed."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    kinds = {"replace": HookType.REPLACE, "around": HookType.AROUND, "after": HookType.AFTER}
    before = {h.target: resolve(h.target) for h in hooks}
    for h in hooks:
        HookRegistry.register(h.target, h.fn, kinds[h.type])
    HookRegistry.apply_hooks()  # idempotent: targets already patched are skipped
    out = []
    for h in hooks:
        applied = resolve(h.target) is not before[h.target]
        out.append({"target": h.target, "type": h.type, "applied": applied})
        if not applied:
            raise RuntimeError(f"HookRegistry did not apply the hook on {h.target} "
                               "(see the SGLang log for its exception)")
    return out


def install_contract(info: SglangInfo, writer: ReceiptWriter,
                     patches: Mapping[str, str]) -> Receipt:
    """The routed-scaling contract observer (AFTER DeepseekV2MoE.__init__), one receipt."""
    from dsv4bisect.sglang_hooks import contract

    layout = info.layout or ""
    rec = Receipt(patch=CONTRACT, variant="observe", process=writer.process,
                  sglang_version=info.version, layout=info.layout, targets=[CONTRACT_TARGET],
                  state="installed", expects_call=[CONTRACT_TARGET])
    problem = check_targets([CONTRACT_TARGET], layout)
    if problem is not None:
        rec.state, rec.reason = "refused", problem
        writer.write(rec)
        return rec
    log = _Rec(writer, CONTRACT)
    variant = patches.get("hash-topk-scaling")

    def after_init(result: Any, self: Any, *args: Any, **kwargs: Any) -> None:
        log.called(CONTRACT_TARGET)
        is_hash = type(getattr(self, "topk", None)).__name__ == "HashTopK"
        # the double-scale fault adds one application in HashTopK (hash_topk.extra_factor)
        extra = int(is_hash and variant == "double-scale")
        log.log("layers", contract.layer_row(self, extra))

    writer.write(rec)
    try:
        rec.hooks = apply_hooks((HookSpec(CONTRACT_TARGET, "after", after_init, True),))
    except Exception as exc:  # noqa: BLE001
        rec.state, rec.reason = "failed", f"{type(exc).__name__}: {exc}"
    writer.write(rec)
    return rec

