"""Hot switching inside a running SGLang engine (docs/hot-switching.md, "SGLang").

In hot mode (`DSV4BISECT_SWITCH_DIR` set) the plugin installs, in every scheduler process, the
hooks of the launch set (`DSV4BISECT_PATCHES`, generation 0) and of the hot-switchable
candidates (`DSV4BISECT_HOT`, at their bad-end variants), each behind one gate per hooked
target: the gate looks up the patch's live variant in a dict at every call and runs that
variant's hook, or the original when the patch is off. SGLang's own switches that it reads at
every call (`SglangRule(how="env")` without `read_once`: `envs.X.get()` reads `os.environ` each
time, environ.py) are switched by setting `os.environ` in the process; where the release keeps
a copy of the switch in a module global taken at import and compared per call
(`SglangRule.copies`: sm120-flashmla-backend's `_sm120_default_backend`), the global is assigned
again from the module's own `envs` after `os.environ` is set.

The switch happens in `Scheduler.flush_cache`, wrapped AROUND: SGLang reaches it from
`POST /flush_cache` (`SchedulerFlushWrapper.handle`, bound to the instance's `flush_cache` when
the scheduler is built, after the plugin ran), on every TP rank in the same loop step (rank 0
receives the request and broadcasts it to the others: that is the barrier). When the request
file names a newer generation, and the scheduler is fully idle (SGLang's own `is_fully_idle`),
the wrapper checks that every changed patch is switchable here, applies the new state,
re-captures the decode CUDA graphs (`graphs.refresh_graphs`), lets the original flush the
prefix cache and writes this process's receipt. A patch decided at load time, or one not
installed at launch, makes the receipt `ok: false` naming it, and nothing changes.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4bisect.base.versions import SglangInfo
from dsv4bisect.patchspec.plan import HookSpec, Plan, Recorder, first_call
from dsv4bisect.patchspec.spec import ARCHS, EngineContext, Patch, SglangRule
from dsv4bisect.plugin.receipts import OK_STATES, ProcessInfo, Receipt, ReceiptWriter
from dsv4bisect.sglang_hooks.targets import Signature

logger = logging.getLogger("dsv4bisect.plugin")

_SCHED = "sglang.srt.managers.scheduler.Scheduler"
FLUSH_TARGET = f"{_SCHED}.flush_cache"
IDLE_TARGET = f"{_SCHED}.is_fully_idle"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
# What the switch relies on, in every verified release (tests/sglang/test_hot_static.py).
SWITCH_SIGNATURES = {
    FLUSH_TARGET: Signature(("self", "empty_cache")),
    IDLE_TARGET: Signature(("self", "for_health_check"), exact=False),
}
HOOK_RECEIPT = "hot-switch"  # the receipt of the flush_cache wrapper itself


@dataclass
class SwitchState:
    """The live patch state of one scheduler process. The gates read `active` (patch ->
    variant now on) at every call; it is mutated in place, never rebound."""

    version: str
    process: ProcessInfo
    directory: Path
    active: dict[str, str]
    generation: int = 0
    # hot-switchable patch -> variant -> None (installed) or why it was refused at launch
    hot: dict[str, dict[str, str | None]] = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)  # launch patch -> why it is load-time
    env_rules: dict[str, SglangRule] = field(default_factory=dict)  # hot env switch -> rule
    broken: str | None = None  # the switch itself could not be installed

    def env_now(self) -> dict[str, str]:
        return {var: os.environ.get(var, "") for rule in self.env_rules.values()
                for var in sorted(rule.variables)}

    def copies_now(self) -> dict[str, str]:
        """Each import-time copy's value as this process's code now reads it."""
        out = {}
        for rule in self.env_rules.values():
            for c in rule.copies:
                mod = sys.modules.get(c.module)
                out[c.target] = repr(getattr(mod, c.name, None)) if mod else "(not imported)"
        return out


def load_time_reason(patch: Patch, version: tuple[int, ...] | None) -> str | None:
    """Why the patch's state is decided when the engine loads, on any GPU of this release
    (the plugin does not know the GPU; a rule that is load-time on one counts)."""
    for arch in ARCHS:
        why = patch.load_time_reason(EngineContext("sglang", sglang_version=version,
                                                   gpu_arch=arch))
        if why:
            return why
    return None


def env_rule(patch: Patch, version: tuple[int, ...] | None) -> SglangRule | None:
    """The patch's per-call upstream switch on this release (any GPU), if it has one."""
    if version is None:
        return None
    return next((r for r in patch.sglang.rules if r.how == "env" and not r.read_once
                 and r.covers(version, None)), None)


def deliverable_env(release: str) -> frozenset[str]:
    """The SGLang env switches this plugin's switch file can flip in a running engine of
    `release`: the variables of the built-in patches' per-call env rules there (any GPU). The
    switch file carries patches, not free env variables, so a switch outside these is
    launched fresh even when the release reads it at every call (docs/sglang.md)."""
    from dsv4bisect.patching.registry import builtin_patches

    version = _vt(release)
    if version is None:
        return frozenset()
    return frozenset(var for patch in builtin_patches().values() for rule in patch.sglang.rules
                     if rule.how == "env" and not rule.read_once and rule.covers(version, None)
                     for var in rule.variables)


def check_copies(rule: SglangRule) -> str | None:
    """Why the rule's import-time copies cannot be re-assigned in this process (None: they
    can): each module imports, holds the global, and has the `envs` it was computed from."""
    for c in rule.copies:
        try:
            mod = importlib.import_module(c.module)
        except Exception as exc:  # noqa: BLE001 - any import failure refuses the switch
            return f"cannot import {c.module}: {type(exc).__name__}: {exc}"
        if not hasattr(mod, c.name):
            return f"{c.target} is gone (the release no longer copies {c.var} at import)"
        field_ = getattr(getattr(mod, "envs", None), c.var, None)
        if not callable(getattr(field_, "get", None)):
            return f"{c.module} has no envs.{c.var}.get() to re-read the switch from"
    return None


def assign_copies(rule: SglangRule) -> None:
    """Assign each copy as the import did: `name = envs.VAR.get()` in the module's namespace
    (os.environ already holds the new value). A module not imported yet needs nothing: its
    import will read the new value."""
    for c in rule.copies:
        mod = sys.modules.get(c.module)  # imported by check_copies at launch where it can be
        if mod is not None:
            setattr(mod, c.name, getattr(mod.envs, c.var).get())


def gate(patch: str, target: str, by_variant: Mapping[str, HookSpec], active: dict[str, str],
         rec: Recorder) -> HookSpec:
    """One AROUND hook on `target` that runs the live variant's hook, or the original."""
    mark = first_call(rec, target)  # evidence that the path is taken, whichever state is on
    table = dict(by_variant)

    def around(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        mark()
        spec = table.get(active.get(patch))  # type: ignore[arg-type]
        if spec is None:
            return original(*args, **kwargs)
        if spec.type == "replace":
            return spec.fn(*args, **kwargs)
        if spec.type == "around":
            return spec.fn(original, *args, **kwargs)
        result = original(*args, **kwargs)  # after
        modified = spec.fn(result, *args, **kwargs)
        return result if modified is None else modified

    return HookSpec(target, "around", around, on_path=any(s.on_path for s in table.values()))


def gated_plan(patch: Patch, variants: list[str], layout: str, rec: Recorder,
               state: SwitchState) -> Plan:
    """The patch's plans for each variant, merged into one gate per target. `variants[0]` is
    the variant being installed (its refusal refuses the patch, as without hot mode)."""
    from dsv4bisect.plugin.install import planner

    name = patch.name
    plans = {v: planner(patch)(v, layout, rec) for v in variants}
    by_target: dict[str, dict[str, HookSpec]] = {}
    notes, checks = list(plans[variants[0]].notes), []
    for v, plan in plans.items():
        state.hot.setdefault(name, {})[v] = plan.reason if plan.action == "refuse" else None
        if plan.action == "inert":
            notes.append(f"{v}: inert ({plan.reason}); the original runs while it is on")
        for h in plan.hooks if plan.action == "install" else ():
            by_target.setdefault(h.target, {})[v] = h
        if plan.check is not None:
            checks.append(plan.check)
    first = plans[variants[0]]
    if first.action == "refuse" or not by_target:
        return first

    def check() -> str | None:
        return next((why for why in (c() for c in checks) if why), None)

    hooks = tuple(gate(name, t, specs, state.active, rec) for t, specs in by_target.items())
    return Plan("install", hooks, notes=(*notes, "gated: switchable in the running engine"),
                check=check)


def install_hot(launch: Mapping[str, str], hot: Mapping[str, str], info: SglangInfo,
                writer: ReceiptWriter, known: Mapping[str, Patch],
                directory: Path) -> tuple[list[Receipt], SwitchState]:
    """Install launch ∪ hot (patches of `known`, the registry) with gates and the flush_cache
    switch; receipts for the launch set (as without hot mode) plus one for the switch
    itself."""
    from dsv4bisect.plugin.install import install_patches, planner

    version = info.version_tuple
    state = SwitchState(info.version or "", writer.process, directory, dict(launch))
    wanted: dict[str, list[str]] = {n: [v] for n, v in launch.items()}
    for n, v in hot.items():
        if v not in wanted.setdefault(n, []):
            wanted[n].append(v)
    for name in wanted:
        why = load_time_reason(known[name], version)
        if why and name in launch:
            state.fixed[name] = why
        rule = env_rule(known[name], version)
        if rule is not None and not why:
            state.env_rules[name] = rule

    def plan_for(name: str, variant: str, switch: frozenset[str], rec: Recorder) -> Plan:
        layout = info.layout or ""
        if switch or load_time_reason(known[name], version):  # as without hot mode
            if name in state.env_rules:  # flipped live: every variant is an env value
                state.hot[name] = {p.name: None for p in known[name].variants}
            return planner(known[name], switch)(variant, layout, rec)
        order = [variant] + [v for v in wanted[name] if v != variant]
        return gated_plan(known[name], order, layout, rec, state)

    receipts = install_patches(launch, info, writer, known, plan_for)
    # hot-only candidates (a load-time one is never installed: a request for it is refused)
    extra = {n: wanted[n][0] for n in wanted
             if n not in launch and not load_time_reason(known[n], version)}
    if extra:  # installed the same way, their receipts kept in memory
        for r in install_patches(extra, info, ReceiptWriter(None, writer.process), known,
                                 plan_for, contract=False):
            if r.state not in OK_STATES:
                state.hot[r.patch] = {v: f"{r.state} at launch: {r.reason}"
                                      for v in wanted[r.patch]}
    for r in receipts:
        if r.patch in state.hot and r.state not in OK_STATES:
            state.hot[r.patch] = {v: f"{r.state} at launch: {r.reason}" for v in wanted[r.patch]}
    for name, rule in state.env_rules.items():
        why = check_copies(rule) if name in state.hot and rule.copies else None
        if why:  # the env would change but the copy the release dispatches on would not
            state.hot[name] = {v: f"not switchable here: {why}" for v in state.hot[name]}
    receipts.append(install_switch(state, info, writer))
    return receipts, state


def install_switch(state: SwitchState, info: SglangInfo, writer: ReceiptWriter) -> Receipt:
    """The AROUND hook on Scheduler.flush_cache, after checking what it relies on."""
    from dsv4bisect.plugin.graphs import recapture_entry
    from dsv4bisect.plugin.install import apply_hooks, resolve, signature_names

    rec = Receipt(patch=HOOK_RECEIPT, variant=f"generation {state.generation}",
                  process=writer.process, sglang_version=info.version, layout=info.layout,
                  targets=[FLUSH_TARGET], state="installed",
                  notes=[f"switch dir {state.directory}"])
    problem = None if info.layout is not None else (info.reason or "unknown SGLang layout")
    entry = recapture_entry(info.version_tuple)
    needed = dict(SWITCH_SIGNATURES)
    if entry is not None:
        needed[f"{MODEL_RUNNER}.{entry[0]}"] = Signature(("self",))
    for target, sig in needed.items() if problem is None else ():
        try:
            names = signature_names(resolve(target))
        except (ImportError, AttributeError, ValueError) as exc:
            problem = f"cannot resolve {target}: {type(exc).__name__}: {exc}"
            break
        if names is not None and (why := sig.mismatch(names)):
            problem = f"{target} changed: {why}"
            break
    if problem is None and entry is None:
        problem = f"no CUDA-graph re-capture entry is known for SGLang {info.version}"
    if problem is not None:
        rec.state, rec.reason, state.broken = "refused", problem, problem
    else:
        try:
            rec.hooks = apply_hooks((HookSpec(FLUSH_TARGET, "around", flush_hook(state)),))
        except Exception as exc:  # noqa: BLE001 - written down, not raised
            rec.state, rec.reason = "failed", f"{type(exc).__name__}: {exc}"
            state.broken = rec.reason
    writer.write(rec)
    return rec


def refusals(state: SwitchState, new: Mapping[str, str]) -> list[str]:
    """Why the switch to `new` cannot happen in this process (empty: it can)."""
    from dsv4bisect.patching.registry import builtin_patches

    known = builtin_patches()
    out = []
    for name in [n for n in known if n in new or n in state.active]:
        old, want = state.active.get(name), new.get(name)
        if old == want:
            continue
        label = f"{name}:{want}" if want else f"{name} (off)"
        why = state.fixed.get(name) or load_time_reason(known[name], _vt(state.version))
        if why:
            out.append(f"{label}: decided at load time, needs a fresh launch ({why})")
        elif name not in state.hot:
            out.append(f"{label}: not installed at launch (in neither DSV4BISECT_PATCHES nor "
                       "DSV4BISECT_HOT)")
        elif want is not None and want not in state.hot[name]:
            out.append(f"{label}: variant not installed at launch (have "
                       f"{', '.join(state.hot[name])})")
        elif want is not None and state.hot[name][want] is not None:
            out.append(f"{label}: refused at launch: {state.hot[name][want]}")
    return out


def _vt(version: str) -> tuple[int, ...] | None:
    from dsv4bisect.base.versions import parse_version

    return parse_version(version) if version else None


def apply_state(state: SwitchState, new: Mapping[str, str]) -> None:
    """Set the env switches (and their import-time copies) and the gates' live variants (in
    place)."""
    for name, rule in state.env_rules.items():
        os.environ.update(rule.on_env(new[name]) if name in new else dict(rule.off))
        assign_copies(rule)
    state.active.clear()
    state.active.update(new)


def _wire(patches: Mapping[str, str]) -> str:
    from dsv4bisect.patching.registry import builtin_patches
    from dsv4bisect.patching.wire import format_patch_set

    return format_patch_set(patches, builtin_patches())


@dataclass(frozen=True)
class Outcome:
    """What one process did with a switch request (its receipt's fields)."""

    ok: bool
    error: str | None
    graphs: str  # recaptured | eager | none


def switch(state: SwitchState, scheduler: Any, request: Any,
           flush: Callable[[], Any]) -> tuple[Outcome, Any]:
    """Apply `request` (generation, wire) in this idle scheduler, then let SGLang flush."""
    from dsv4bisect.errors import PatchError
    from dsv4bisect.patching.registry import builtin_patches
    from dsv4bisect.patching.wire import parse_patch_set
    from dsv4bisect.plugin.graphs import GraphError, refresh_graphs

    graphs, error = "none", None
    try:
        new = parse_patch_set(request.patches, builtin_patches())
    except PatchError as exc:
        new, error = dict(state.active), f"bad patch set in the request: {exc.message}"
    problems = [] if error else refusals(state, new)
    if state.broken:
        problems.insert(0, state.broken)
    if problems:
        error = "; ".join(problems)
    elif not error and new != state.active:
        apply_state(state, new)
        try:
            runner = scheduler.tp_worker.model_runner
            graphs = refresh_graphs(runner, state.version,
                                    getattr(scheduler, "draft_worker", None) is not None)
        except GraphError as exc:
            error = f"switched, but {exc}"
        except Exception as exc:  # noqa: BLE001 - a failed capture is reported, not raised
            error = f"switched, but re-capturing the CUDA graphs failed: " \
                    f"{type(exc).__name__}: {exc}"
    result = flush()  # SGLang's own flush: the prefix cache holds nothing of the old state
    if error is None and result is False:
        error = "flush_cache did not flush (the scheduler was not idle)"
    return Outcome(error is None, error, graphs), result


def flush_hook(state: SwitchState) -> Callable[..., Any]:
    """AROUND Scheduler.flush_cache(self, empty_cache=True)."""

    from dsv4bisect.base.switching import read_request, write_receipt

    def around(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        request = read_request(state.directory)
        if request is None or request.generation <= state.generation:
            return original(self, *args, **kwargs)
        if not self.is_fully_idle():  # SGLang's own check; the driver drains first
            out = Outcome(False, "the scheduler was not idle (requests in flight): drain "
                          "before switching", "none")
            result = original(self, *args, **kwargs)
        else:
            out, result = switch(state, self, request, lambda: original(self, *args, **kwargs))
            state.generation = request.generation
        p = state.process
        write_receipt(state.directory, request.generation, p.role, p.tp_rank or 0, ok=out.ok,
                      patches=_wire(state.active), error=out.error, graphs=out.graphs,
                      env=state.env_now(), copies=state.copies_now(), dp_rank=p.dp_rank)
        logger.info("dsv4bisect: switch generation %d %s: %s", request.generation,
                    "applied" if out.ok else "refused", out.error or _wire(state.active))
        return result

    return around
