"""Profile + command-line overrides → `EngineConfig` (DESIGN §4).

`--set key=value` edits the merged data before validation (so types are checked); `--only`,
`--enable` and `--disable` then toggle patches; `--set patches.P.variant=V` also enables P.
Every value keeps its provenance (file position or flag) for `profile show --why`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4bisect import env as envvars
from dsv4bisect.base import vllm_releases
from dsv4bisect.base.versions import ALLOW_ENV, parse_version
from dsv4bisect.config import fingerprint as fp
from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.config.engine_config import EngineConfig, PatchChoice
from dsv4bisect.config.layering import (
    Layered,
    display_path,
    find_profile,
    load_layers,
    set_value,
)
from dsv4bisect.config.processes import PatchDelivery, build_processes
from dsv4bisect.config.schema import Profile
from dsv4bisect.config.validate import error_at, validate
from dsv4bisect.config.worktree import SourceChange, WorktreePlan, materialize, plan_worktree
from dsv4bisect.errors import ConfigError, PatchError
from dsv4bisect.patching.registry import builtin_patches, unknown_patch_hint
from dsv4bisect.patching.wire import format_patch_set
from dsv4bisect.patchspec.spec import EngineContext, Patch


# What `run`, `bisect` and `doctor` take when no profile is given: the six patches on the
# embedded engine (profiles/reference-all.yaml), judged against `reference`.
DEFAULT_PROFILE = "reference-all"


@dataclass(frozen=True)
class Overrides:
    sets: tuple[str, ...] = ()  # "dotted.key=value"
    enable: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None
    # A trial between two configurations (bisect --good-config/--bad-config) also removes keys
    # (`engine.env.X`, `engine.max_running_requests`: back to the engine's default) and sets
    # single server flags inside `engine.args` (flag -> value; None removes the flag).
    unset: tuple[str, ...] = ()
    args: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class LoadedProfile:
    profile: Profile
    layered: Layered


def load_profile(ref: str, overrides: Overrides = Overrides()) -> LoadedProfile:
    layered = load_layers(find_profile(ref))
    _apply_overrides(layered, overrides)
    profile = validate(layered)
    _check_patch_names(profile, layered)
    return LoadedProfile(profile, layered)


def resolve(
    ref: str, overrides: Overrides = Overrides(), *, materialize_worktree: bool = False
) -> EngineConfig:
    return resolve_loaded(load_profile(ref, overrides), materialize_worktree=materialize_worktree)


def resolve_loaded(loaded: LoadedProfile, *, materialize_worktree: bool = False) -> EngineConfig:
    profile, layered = loaded.profile, loaded.layered
    engine = profile.engine
    ctx = engine_context(profile)
    available = _available_patches(profile, ctx)
    enabled = tuple(_with_variant(p, profile, ctx) for p in available
                    if p.name in profile.patches and profile.patches[p.name].enabled)
    if ctx.kind != "vllm":  # the masks describe SGLang's code paths (and the embedded engine's)
        enabled = _apply_masks(enabled)
    _check_switch_env(profile, ctx, layered)
    on = {p.name for p in enabled}
    missing = [p for p in available if p.required and p.name not in on]
    cannot_start = "; ".join(f"`{p.name}` is off but {p.required}" for p in missing) or None

    plan = _worktree_plan(profile, layered, enabled)
    if plan is not None and materialize_worktree:
        materialize(plan)
    delivery = _delivery(profile, ctx, enabled, plan)
    roles = _role_deliveries(profile, ctx, available, plan)
    for role, role_on in (roles or {}).items():
        missing_here = [p for p in available if p.required and p.name not in role_on[1]]
        cannot_start = cannot_start or "; ".join(
            f"`{p.name}` is off on the {role} server but {p.required}" for p in missing_here
        ) or None
    entry, processes = build_processes(engine, delivery,
                                       {r: d for r, (d, _) in (roles or {}).items()})
    config = EngineConfig(
        profile=profile.name, kind=engine.kind, host=engine.host, entry_role=entry,
        processes=processes, patches=enabled, available=available, model=engine.model,
        served_model_name=engine.served_model_name, api_key_env=engine.api_key_env,
        startup_timeout_s=engine.startup_timeout_s, probe=profile.probe.model_dump(),
        bisect=profile.bisect.model_dump(), cannot_start=cannot_start,
        worktree=str(plan.path) if plan else None,
        provenance=_provenance(profile, layered),
    )
    identity = _identity(profile, config, plan)
    return _replace(config, identity=identity, fingerprint=fp.digest(identity))


def engine_context(profile: Profile) -> EngineContext:
    engine = profile.engine
    version_text = (fp.installed_sglang_version() or engine.sglang_version
                    if engine.kind == "sglang" else None)
    vllm_text = (fp.installed_vllm_version() or engine.vllm_version
                 if engine.kind == "vllm" else None)
    return EngineContext(
        kind=engine.kind,
        moe_backend=engine.moe_backend,
        sglang_version=parse_version(version_text) if version_text else None,
        expert_quant=engine.expert_quant,
        # the seed deployment's GPUs when a profile does not say (docs/sglang.md)
        gpu_arch=(engine.gpu_arch or "sm120") if engine.kind == "sglang" else engine.gpu_arch,
        vllm_version=parse_version(vllm_text) if vllm_text else None,
    )


def delivery_of(patch: Patch, ctx: EngineContext, variant: str) -> tuple[str, bool, str | None]:
    """(how "on" reaches this engine, whether it is sent to the engine at all, why not when
    no rule covers a switch-only patch on this release)."""
    if ctx.kind == "vllm":
        return patch.vllm.reaches(patch.name, variant, ctx)
    if ctx.kind != "sglang":
        return ("reference" if ctx.kind == "reference" else ctx.kind), True, None
    rule = patch.sglang.rule(ctx.sglang_version, ctx.gpu_arch)
    if rule is None:
        if any(patch.sglang.hooks.values()):
            return "hook", True, None
        known = "unknown" if ctx.sglang_version is None else \
            ".".join(map(str, ctx.sglang_version))
        return "absent", False, (f"no delivery declared for SGLang {known} on {ctx.gpu_arch} "
                                 "(pin engine.sglang_version to a verified release)")
    if rule.how == "env":
        return "env " + " ".join(f"{k}={v}" for k, v in rule.on_env(variant).items()), True, None
    if rule.how == "args":
        return "args " + " ".join(patch.sglang.args), True, None
    return rule.how, rule.how == "hook", None


def _available_patches(profile: Profile, ctx: EngineContext) -> tuple[PatchChoice, ...]:
    out = [
        _choice(p, ctx, p.default_variant, fault=False) for p in builtin_patches().values()
    ]
    out += [
        PatchChoice(name=name, variant="custom", fault=False, builtin=False, tier=c.tier,
                    summary=c.summary, load_time="a custom source patch is built into the "
                    "engine's worktree")
        for name, c in profile.custom_patches.items()
    ]
    return tuple(out)


def _choice(patch: Patch, ctx: EngineContext, variant: str, fault: bool) -> PatchChoice:
    how, delivered, no_rule = delivery_of(patch, ctx, variant)
    inert = patch.inert_reason(ctx, variant) or no_rule
    if ctx.kind == "reference" and inert is not None and not patch.reference_modelled:
        delivered = False  # the embedded engine has nothing to switch
    if ctx.kind == "vllm" and inert is not None:
        delivered = False  # a hook on a path vLLM does not take would never be called
    return PatchChoice(name=patch.name, variant=variant, fault=fault, builtin=True,
                       tier=patch.tier, summary=patch.summary, inert=inert,
                       required=patch.required_reason(ctx), delivered=delivered, delivery=how,
                       load_time=patch.load_time_reason(ctx))


def _with_variant(choice: PatchChoice, profile: Profile, ctx: EngineContext) -> PatchChoice:
    if not choice.builtin:
        return choice
    patch = builtin_patches()[choice.name]
    variant = patch.variant(profile.patches[choice.name].variant)
    assert variant is not None  # checked by _check_patch_names
    return _choice(patch, ctx, variant.name, variant.fault)


def _apply_masks(enabled: tuple[PatchChoice, ...]) -> tuple[PatchChoice, ...]:
    """A patch whose "on" another active patch keeps from acting is inert and not delivered
    (e.g. mhc-bf16 while SGLang's fused mHC bypasses hc_pre): the configuration built never
    claims an effect the engine cannot have (its hook would install and never be called). A
    masked patch masks nothing in turn; masks form no cycle (a test holds this)."""
    builtins = builtin_patches()
    by_name = {c.name: c for c in enabled}
    masked: dict[str, Any] = {}

    def active(name: str) -> bool:
        c = by_name.get(name)
        return c is not None and c.inert is None and mask_of(name) is None

    def mask_of(name: str) -> Any:
        if name not in masked:
            c = by_name[name]
            masks = builtins[name].masked_by if c.builtin else ()  # inert or not: never sent
            masked[name] = next((m for m in masks if active(m.by)), None)
        return masked[name]

    out = []
    for c in enabled:
        mask = mask_of(c.name)
        out.append(c if mask is None else _replace(
            c, inert=f"masked by {mask.by}: {mask.reason}", delivered=False,
            delivery=f"masked by {mask.by}"))
    return tuple(out)


def _switch_env(ctx: EngineContext, enabled: tuple[PatchChoice, ...]) -> dict[str, str]:
    """The upstream switches' env: "on" for the enabled ones that are delivered, "off" (the
    most exact path the release has) for every other switch the release lets us drive."""
    if ctx.kind != "sglang":
        return {}
    on = {c.name: c.variant for c in enabled if c.builtin and c.delivered}
    env: dict[str, str] = {}
    for name, patch in builtin_patches().items():
        rule = patch.sglang.rule(ctx.sglang_version, ctx.gpu_arch)
        if rule is None or rule.how != "env":
            continue
        env.update(rule.on_env(on[name]) if name in on else rule.off)
    if env:  # the plugin compares what SGLang's schedulers see with what was asked
        env[envvars.SWITCHES] = ",".join(f"{k}={v}" for k, v in sorted(env.items()))
    return env


def _check_switch_env(profile: Profile, ctx: EngineContext, layered: Layered) -> None:
    """Neither engine.env nor a custom patch may drive a variable a built-in switch drives:
    one switch, one patch."""
    if ctx.kind != "sglang":
        return
    setters = [(("engine", "env"), profile.engine.env)] + [
        (("custom_patches", n, "env"), c.env) for n, c in profile.custom_patches.items()]
    pd = profile.engine.pd
    if pd is not None:  # a PD role's env may not drive a switch either: its patches do
        setters += [(("engine", "pd", role, "env"), spec.env)
                    for role, spec in (("prefill", pd.prefill), ("decode", pd.decode))]
    for name, patch in builtin_patches().items():
        rule = patch.sglang.rule(ctx.sglang_version, ctx.gpu_arch)
        if rule is None:
            continue
        for where, env in setters:
            clash = sorted(rule.variables & set(env))
            if clash:
                raise error_at(layered, (*where, clash[0]),
                               f"{clash[0]} is driven by the built-in patch `{name}` on this "
                               "release", f"remove it from {'.'.join(where)} and use "
                               f"`patches: {{{name}: true}}` (or false: its off value is set)")


def _delivery(profile: Profile, ctx: EngineContext, enabled: tuple[PatchChoice, ...],
              plan: WorktreePlan | None) -> PatchDelivery:
    builtins = builtin_patches()
    env: dict[str, str] = _switch_env(ctx, enabled)
    if profile.engine.kind == "sglang" and profile.engine.allow_unverified_sglang:
        env[ALLOW_ENV] = "1"
    if profile.engine.kind == "vllm" and profile.engine.allow_unverified_vllm:
        env[vllm_releases.ALLOW_ENV] = "1"
    args: list[str] = []
    for choice in enabled:
        if choice.builtin:
            if profile.engine.kind == "sglang" and choice.delivered:
                env.update(builtins[choice.name].sglang.env)
                args += builtins[choice.name].sglang.args
            elif profile.engine.kind == "vllm" and choice.delivered:
                args += builtins[choice.name].vllm.args
        else:
            custom = profile.custom_patches[choice.name]
            env.update(custom.env)
            args += custom.args
    # server-argument patches reach SGLang by their arguments alone (the plugin has nothing to
    # install for them); the embedded engine reads every patch from the wire
    plugin = [c for c in enabled if c.builtin and c.delivered and not (
        profile.engine.kind in ("sglang", "vllm") and (c.delivery or "").startswith("args"))]
    wire = format_patch_set({c.name: c.variant for c in plugin}, builtins)
    pythonpath = None
    if plan is not None:
        pythonpath = "{worktree}/" + str(plan.pythonpath.relative_to(plan.path))
    return PatchDelivery(wire, env, tuple(args), pythonpath)


def _role_deliveries(profile: Profile, ctx: EngineContext, available: tuple[PatchChoice, ...],
                     plan: WorktreePlan | None
                     ) -> dict[str, tuple[PatchDelivery, set[str]]] | None:
    """Each PD role's delivery and patch names: the profile's patches with the role's own
    toggles (`engine.pd.<role>.patches`) applied, masks decided on the role's set. A role with
    toggles also gets them as DSV4BISECT_ROLE_PATCHES, which a hot switch keeps applying
    (`name[:variant]` on, `!name` off)."""
    pd = profile.engine.pd
    if pd is None:
        return None
    out: dict[str, tuple[PatchDelivery, set[str]]] = {}
    builtins = builtin_patches()
    for role, spec in (("prefill", pd.prefill), ("decode", pd.decode)):
        on = {p.name: p for p in available
              if p.name in profile.patches and profile.patches[p.name].enabled}
        on = {n: _with_variant(c, profile, ctx) for n, c in on.items()}
        overlay = []
        for name, toggle in spec.patches.items():
            if not toggle.enabled:
                on.pop(name, None)
                overlay.append(f"!{name}")
                continue
            choice = next(c for c in available if c.name == name)
            if choice.builtin:
                variant = builtins[name].variant(toggle.variant)
                assert variant is not None  # checked by _check_patch_names
                choice = _choice(builtins[name], ctx, variant.name, variant.fault)
                overlay.append(name if variant.name == builtins[name].default_variant
                               else f"{name}:{variant.name}")
            on[name] = choice
        ordered = _apply_masks(tuple(on[c.name] for c in available if c.name in on))
        delivery = _delivery(profile, ctx, ordered, plan)
        if overlay:
            delivery.env[envvars.ROLE_PATCHES] = ",".join(overlay)
        out[role] = (delivery, set(on))
    return out


def _worktree_plan(profile: Profile, layered: Layered,
                   enabled: tuple[PatchChoice, ...]) -> WorktreePlan | None:
    # Diff paths are relative to the profile file that declared the source.
    dirs = {display_path(path): path.parent for path in layered.files}
    changes = []
    for choice in enabled:
        custom = profile.custom_patches.get(choice.name)
        if custom is not None and custom.source is not None:
            where = layered.source_of(("custom_patches", choice.name, "source"))
            base_dir = dirs.get(getattr(where, "file", ""), Path.cwd())
            changes.append(SourceChange(choice.name, custom.source, base_dir))
    return plan_worktree(changes) if changes else None


def _identity(profile: Profile, config: EngineConfig, plan: WorktreePlan | None) -> dict[str, Any]:
    engine = profile.engine
    if engine.kind == "reference":
        checkpoint = engine.reference.checkpoint if engine.reference else "embedded"
        model = _reference_model_identity(checkpoint)
        version: Any = fp.reference_engine_version()
    elif engine.kind == "sglang":
        model = fp.model_identity(engine.model)
        version = {"sglang": fp.installed_sglang_version() or engine.sglang_version or "unknown"}
    elif engine.kind == "vllm":
        model = fp.model_identity(engine.model)
        version = {"vllm": fp.installed_vllm_version() or engine.vllm_version or "unknown"}
    else:
        model, version = {"model": engine.model}, {"command": "unversioned"}
    return {
        "kind": engine.kind,
        "processes": [
            {"role": p.role, "argv": list(p.argv), "env": dict(p.env), "gpus": list(p.gpus)}
            for p in config.processes
        ],
        "patches": [[p.name, p.variant] for p in config.patches],
        "custom_patches": {k: v.model_dump() for k, v in profile.custom_patches.items()
                           if k in config.patch_set},
        "worktree": plan.identity if plan else None,
        "model": model,
        "engine_version": version,
        "code": fp.code_hash(),
    }


def _reference_model_identity(checkpoint: str) -> dict[str, Any]:
    if checkpoint == "random":
        return {"model": "random-tiny-seed0"}
    if checkpoint == "embedded":
        return fp.model_identity(str(EMBEDDED_CHECKPOINT))
    return fp.model_identity(checkpoint)


def _provenance(profile: Profile, layered: Layered) -> dict[str, str]:
    out: dict[str, str] = {}

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, dict) and value:
            for key, sub in value.items():
                walk(sub, path + (key,))
            return
        source = layered.provenance.get(path)
        out[".".join(map(str, path))] = str(source) if source is not None else "default"

    walk(profile.model_dump(exclude={"extends"}), ())
    return out


def _replace(obj: Any, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(obj, **changes)


# ---- overrides --------------------------------------------------------------------------------

def _apply_overrides(layered: Layered, ov: Overrides) -> None:
    _expand_bool_toggles(layered)
    variant_sets: set[str] = set()
    for item in ov.sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item}: expected key=value", "e.g. --set engine.tp=4")
        created = _new_sections(layered.data, key.strip())
        path = set_value(layered, key.strip(), value.strip(), source=f"--set {item}")
        for section in created:  # a section --set made is blamed on --set, not on the file
            layered.provenance[section] = f"--set {item}"
        if len(path) == 3 and path[0] == "patches" and path[2] == "variant":
            variant_sets.add(str(path[1]))
    for key in ov.unset:
        _unset(layered, key)
    for flag, value in ov.args:
        _set_arg(layered, flag, value)
    known = _known_names(layered)
    for name in [*(ov.only or ()), *ov.enable, *ov.disable]:
        if name not in known:
            raise PatchError(f"unknown patch `{name}`", unknown_patch_hint(name, dict.fromkeys(known)))
    clash = set(ov.enable) & set(ov.disable)
    if clash:
        raise PatchError(f"`{sorted(clash)[0]}` is both enabled and disabled", "drop one flag")
    if ov.only is not None:
        for name in known:
            _toggle(layered, name, name in ov.only, f"--only {','.join(ov.only)}")
    for name in variant_sets:
        if not (ov.only is not None and name not in ov.only) and name not in ov.disable:
            _toggle(layered, name, True, f"--set patches.{name}.variant")
    for name in ov.enable:
        _toggle(layered, name, True, f"--enable {name}")
    for name in ov.disable:
        _toggle(layered, name, False, f"--disable {name}")


def _unset(layered: Layered, dotted: str) -> None:
    """Remove `dotted` from the merged profile (absent: the schema's default applies)."""
    keys = dotted.split(".")
    node: Any = layered.data
    for key in keys[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(keys[-1], None)
    for stale in [p for p in layered.provenance if p[: len(keys)] == tuple(keys)]:
        del layered.provenance[stale]


def _set_arg(layered: Layered, flag: str, value: str | None) -> None:
    """`engine.args` with every occurrence of `flag` (and its values) replaced by `flag value`
    (`value` "": a bare flag; None: the flag removed)."""
    engine = layered.data.setdefault("engine", {})
    args = engine.get("args") if isinstance(engine, dict) else None
    if not isinstance(engine, dict) or not isinstance(args, (list, type(None))):
        raise ConfigError(f"engine.args: cannot set {flag}", "engine.args must be a list")
    kept: list[Any] = []
    skipping = False
    for token in args or []:
        text = str(token)
        if text.startswith("--"):
            skipping = text.partition("=")[0] == flag
        if not skipping:
            kept.append(token)
    if value is not None:
        kept += [flag, *value.split()]
    engine["args"] = kept
    layered.provenance[("engine", "args")] = f"--good-config/--bad-config {flag}"


def _new_sections(data: dict[str, Any], dotted: str) -> list[tuple[str, ...]]:
    """The sections `--set dotted=...` creates because the profile does not have them."""
    keys, node = tuple(dotted.split(".")), data
    for depth, key in enumerate(keys[:-1]):
        if not isinstance(node, dict) or key not in node:
            return [keys[:cut] for cut in range(depth + 1, len(keys))]
        node = node[key]
    return []


def _expand_bool_toggles(layered: Layered) -> None:
    """`P: true` becomes `P: {enabled: true}` so that --set patches.P.variant=V can apply (the
    profile's patches and a PD role's own)."""
    engine = layered.data.get("engine")
    pd = engine.get("pd") if isinstance(engine, dict) else None
    where = [("patches",)] + [("engine", "pd", role, "patches") for role in ("prefill", "decode")
                              if isinstance(pd, dict) and isinstance(pd.get(role), dict)]
    for path in where:
        node: Any = layered.data
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        for name, value in node.items():
            if isinstance(value, bool):
                node[name] = {"enabled": value}
                mark = layered.provenance.get((*path, name))
                if mark is not None:
                    layered.provenance[(*path, name, "enabled")] = mark


def _known_names(layered: Layered) -> list[str]:
    custom = layered.data.get("custom_patches") or {}
    return list(builtin_patches()) + [str(k) for k in custom if isinstance(custom, dict)]


def _toggle(layered: Layered, name: str, enabled: bool, source: str) -> None:
    patches = layered.data.setdefault("patches", {})
    if not isinstance(patches, dict):
        raise ConfigError(f"{source}: `patches` is not a mapping", "fix the profile's patches")
    current = patches.get(name)
    entry = dict(current) if isinstance(current, dict) else {}
    entry["enabled"] = enabled
    patches[name] = entry
    layered.provenance[("patches", name, "enabled")] = source


def _check_patch_names(profile: Profile, layered: Layered) -> None:
    builtins = builtin_patches()
    for name in profile.custom_patches:
        if name in builtins:
            raise error_at(layered, ("custom_patches", name),
                           "a custom patch cannot reuse a built-in patch's name", "rename it")
    known = dict.fromkeys([*builtins, *profile.custom_patches])
    toggles: list[tuple[tuple[str, ...], dict[str, Any]]] = [(("patches",), profile.patches)]
    pd = profile.engine.pd
    if pd is not None:
        toggles += [(("engine", "pd", role, "patches"), spec.patches)
                    for role, spec in (("prefill", pd.prefill), ("decode", pd.decode))]
    for where, patches in toggles:
        for name, toggle in patches.items():
            if name not in known:
                raise error_at(layered, (*where, name), f"unknown patch `{name}`",
                               unknown_patch_hint(name, known))
            if toggle.variant is None:
                continue
            if name not in builtins:
                raise error_at(layered, (*where, name, "variant"),
                               "custom patches have no variants", "remove `variant`")
            patch = builtins[name]
            if patch.variant(toggle.variant) is None:
                names = [v.name for v in patch.variants]
                raise error_at(layered, (*where, name, "variant"),
                               f"patch `{name}` has no variant `{toggle.variant}`",
                               f"variants of {name}: {', '.join(names)}")
