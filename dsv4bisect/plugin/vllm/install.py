"""Install the hooks of a patch set in this vLLM worker and write one receipt per patch.

vLLM has no hook registry, so the installer does what SGLang's `HookRegistry` does itself: per
hook it resolves the target (importing its module), checks the signature against
`targets.SIGNATURES`, imports the modules `targets.Site.copies` names (the model modules that
did `from M import f`), builds the wrapper (REPLACE `fn(*args)`, AROUND `fn(original, *args)`,
AFTER `fn(result, *args)`), sets it on the owner and rebinds every by-value copy of the
original in the `vllm.*` modules loaded by then. A declared copy left unbound is a refusal (the
layout changed); a module imported later that does `from M import f` gets the hook from M.

Call evidence: a hook inside vLLM's compiled model cannot write a file (Dynamo refuses I/O in a
`fullgraph` trace) but may set a dict entry, which Dynamo replays after the graph. Hooks mark
`CALLED[target] = True`; an AFTER wrapper on the worker's `execute_model` (eager, every step)
writes the receipts when something new was marked. Torch is imported only by the hook modules.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from collections.abc import Callable, Mapping
from typing import Any

from dsv4bisect.base.vllm_releases import VllmInfo
from dsv4bisect.patchspec.plan import HookSpec, Plan
from dsv4bisect.patchspec.spec import Patch, VllmSite
from dsv4bisect.plugin.install import check_targets as _check_targets
from dsv4bisect.plugin.install import resolve
from dsv4bisect.plugin.receipts import Receipt, ReceiptWriter
from dsv4bisect.vllm_hooks import ORIGINALS
from dsv4bisect.vllm_hooks import targets as tg

CALLED: dict[str, bool] = {}  # target -> called (set by the hooks; Dynamo replays the store)
_FLUSHED: set[str] = set()


class Marks:
    """A patch's view of the receipt writer (the planners' `Recorder`): `called` only sets the
    dict entry (safe inside a compiled graph), `log` writes at once (construction time)."""

    def __init__(self, writer: ReceiptWriter, patch: str) -> None:
        self.writer, self.patch = writer, patch

    def called(self, target: str) -> None:
        CALLED[target] = True

    def log(self, key: str, value: Any) -> None:
        self.writer.update_detail(self.patch, key, value)


def check_targets(names: list[str], layout: str) -> str | None:
    """Resolve each target and compare its signature with the vLLM layout's table."""
    return _check_targets(names, layout, tg.SIGNATURES[layout])


def _wrapper(kind: str, fn: Callable[..., Any], original: Any) -> Callable[..., Any]:
    if kind == "replace":
        def hooked(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)
    elif kind == "around":
        def hooked(*args: Any, **kwargs: Any) -> Any:
            return fn(original, *args, **kwargs)
    elif kind == "after":
        def hooked(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            fn(result, *args, **kwargs)
            return result
    else:
        raise ValueError(f"unknown hook type {kind!r}")
    functools.update_wrapper(hooked, original)  # __wrapped__: signature checks see through it
    hooked.__dsv4bisect__ = True  # type: ignore[attr-defined]
    return hooked


def apply_hook(hook: HookSpec, copies: tuple[str, ...]) -> dict[str, Any]:
    """Set the wrapper on the owner and rebind the by-value copies; raise when a declared copy
    did not hold the original (the model module no longer imports it by that name)."""
    for module in copies:
        importlib.import_module(module)
    obj_path, attr = hook.target.rsplit(".", 1)
    owner = pkgutil.resolve_name(obj_path)
    original = resolve(hook.target)
    ORIGINALS.setdefault(hook.target, original)  # before any dsv4bisect hook
    hooked = _wrapper(hook.type, hook.fn, original)
    setattr(owner, attr, hooked)
    rebound = []
    if not isinstance(owner, type):
        for name, module in list(sys.modules.items()):
            if module is None or module is owner or not name.startswith("vllm"):
                continue
            for key, value in list(vars(module).items()):
                if value is original:
                    setattr(module, key, hooked)
                    rebound.append(f"{name}.{key}")
        missing = [m for m in copies if not any(r.startswith(m + ".") for r in rebound)]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} holds no by-value copy of {hook.target}: "
                               "the layout changed (the hook would never be called)")
    return {"target": hook.target, "type": hook.type, "applied": resolve(hook.target) is hooked,
            "rebound": rebound}


def install_patches(patches: Mapping[str, str], info: VllmInfo, writer: ReceiptWriter,
                    known: Mapping[str, Patch]) -> list[Receipt]:
    """Install each patch (name -> variant) of `known` (the registry) with its own vLLM planner
    (`PATCH.planners.vllm`) at the sites it declares (`PATCH.vllm`); one receipt each."""
    receipts = []
    for name, variant in patches.items():
        patch = known[name]
        layout = info.layout or ""
        sites = patch.vllm.sites.get(layout, ()) if info.layout else ()
        base = dict(patch=name, variant=variant, process=writer.process, sglang_version=None,
                    layout=info.layout, targets=[s.target for s in sites], engine="vllm",
                    vllm_version=info.version)
        if info.layout is None:
            rec = Receipt(**base, state="refused", reason=info.reason or "unknown vLLM layout")
        elif patch.planners.vllm is None:
            rec = Receipt(**base, state="refused", reason=f"no vLLM hook for patch {name} (docs/"
                          "vllm.md: it reaches vLLM by its arguments, or not at all)")
        else:
            plan = patch.planners.vllm(variant, layout, Marks(writer, name))
            rec = _install_one(base, plan, layout, sites, patch, writer)
        writer.write(rec)
        receipts.append(rec)
    return receipts


def _install_one(base: dict[str, Any], plan: Plan, layout: str, sites: tuple[VllmSite, ...],
                 patch: Patch, writer: ReceiptWriter) -> Receipt:
    notes = list(plan.notes)
    if plan.action != "install":
        state = "inert" if plan.action == "inert" else "refused"
        return Receipt(**base, state=state, reason=plan.reason, notes=notes)
    by_target = {s.target: s for s in sites}
    stray = [h.target for h in plan.hooks if h.target not in by_target]
    if stray:
        return Receipt(**base, state="refused", notes=notes,
                       reason=f"hook targets not declared for the layout: {', '.join(stray)}")
    problem = check_targets([h.target for h in plan.hooks] + list(patch.vllm.uses.get(layout, ())),
                            layout)
    if problem is None and plan.check is not None:
        problem = plan.check()
    if problem is not None:
        return Receipt(**base, state="refused", reason=problem, notes=notes)
    group = patch.vllm.evidence_key(layout)
    rec = Receipt(**base, state="installed", notes=notes,
                  expects_call=[group] if group else [h.target for h in plan.hooks
                                                      if h.on_path])
    writer.write(rec)
    try:
        rows = [apply_hook(h, by_target[h.target].copies) for h in plan.hooks]
        rec.hooks = [{k: v for k, v in r.items() if k != "rebound"} for r in rows]
        rec.rebound = sorted({m for r in rows for m in r["rebound"]})
        if not all(r["applied"] for r in rows):
            raise RuntimeError("a hook did not replace its target")
    except Exception as exc:  # noqa: BLE001 - any failure is written down, never raised
        rec.state, rec.reason = "failed", f"{type(exc).__name__}: {exc}"
    return rec


def flush_calls(writer: ReceiptWriter, receipts: list[Receipt]) -> None:
    """Write the call evidence the hooks marked since the last flush (cheap when none)."""
    fresh = [t for t in CALLED if t not in _FLUSHED]
    if not fresh:
        return
    _FLUSHED.update(fresh)
    for rec in receipts:
        mine = [t for t in fresh if t in rec.targets]
        for target in mine:  # every site reached, and the group key of alternative sites
            writer.mark_called(rec.patch, target)
        # the evidence key of alternative sites is the one expected call that is no target
        group = next((e for e in rec.expects_call if e not in rec.targets), None)
        if mine and group:
            writer.mark_called(rec.patch, group)


def install_flush(writer: ReceiptWriter, receipts: list[Receipt]) -> str | None:
    """AFTER the worker's warm-up and every `execute_model`: flush the call evidence. None, or
    why not."""

    def after(result: Any, *args: Any, **kwargs: Any) -> None:
        flush_calls(writer, receipts)

    for target in (tg.WORKER_WARMUP, tg.WORKER_STEP):
        try:
            original = resolve(target)
        except (ImportError, AttributeError, ValueError) as exc:
            return f"cannot resolve {target}: {exc}"
        obj_path, attr = target.rsplit(".", 1)
        setattr(pkgutil.resolve_name(obj_path), attr, _wrapper("after", after, original))
    return None


__all__ = ["CALLED", "Marks", "apply_hook", "check_targets", "flush_calls", "install_flush",
           "install_patches", "resolve"]
