"""The question a bisect of a profile asks: the two ends and the candidates between them.

`resolve_question` turns a profile, the shared overrides and `--good/--bad/--candidates` into
the two ends and the candidates (the patches that differ, less the inert ones, each left-out
patch with its reason). `patch_overrides` is how every trial's configuration is resolved:
"exactly these patches on, with these variants", on top of the user's non-patch `--set`s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dsv4bisect.bisect.setting_candidates import is_setting, setting_overrides
from dsv4bisect.config.engine_config import EngineConfig, PatchChoice
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.config.schema import BisectSettings
from dsv4bisect.errors import BisectError, ConfigError, PatchError
from dsv4bisect.patching.registry import builtin_patches, unknown_patch_hint
from dsv4bisect.run.ends import good_overrides


@dataclass(frozen=True)
class Question:
    """What a bisect of a profile asks: the two ends and the candidates between them."""

    profile: str
    sets: tuple[str, ...]  # the user's --set keys that are not patches.* (apply to both ends)
    good: dict[str, str]  # patch -> variant at the good end
    bad: dict[str, str]
    candidates: tuple[str, ...]  # registry order
    left_out: tuple[tuple[str, str], ...]  # (patch, why) for patches that differ, not searched
    tiers: dict[str, int]  # candidate -> risk tier (the prior)
    bisect: BisectSettings  # the profile's `bisect` settings (defaults for the CLI's options)
    deliveries: dict[str, str] = field(default_factory=dict)  # candidate -> how "on" reaches it
    # candidate -> why switching it needs a fresh launch; absent: hot-switchable in a running
    # engine (docs/hot-switching.md)
    load_time: dict[str, str] = field(default_factory=dict)
    # candidate -> its switch tier and where the tier came from (settings of a bisect between
    # two configurations; bisect/switch_info.py)
    tier_names: dict[str, str] = field(default_factory=dict)
    # candidate -> prior weight of a setting from its switch tier (patches: their risk tier)
    setting_weights: dict[str, float] = field(default_factory=dict)
    upgrade: tuple[str, str] | None = None  # (old, new) SGLang release of --upgrade-from


def base_sets(sets: Sequence[str]) -> tuple[str, ...]:
    """The --set keys that apply to both ends (patches.* keys choose the bad end's patches)."""
    return tuple(s for s in sets if not s.strip().startswith("patches."))


def patch_overrides(patches: Mapping[str, str], sets: Sequence[str] = ()) -> Overrides:
    """Overrides that turn exactly `patches` on (with their variants), everything else off;
    the settings among them (bisect/setting_candidates.py) put at their values."""
    builtins = builtin_patches()
    order = {name: i for i, name in enumerate(builtins)}
    settings = {n: v for n, v in patches.items() if is_setting(n)}
    names = sorted((n for n in patches if n not in settings),
                   key=lambda n: (order.get(n, len(order)), n))  # registry order
    variants = tuple(f"patches.{n}.variant={_yaml_str(patches[n])}" for n in names
                     if n in builtins)
    put = setting_overrides(settings)
    return Overrides(sets=(*base_sets(sets), *variants, *put.sets), only=tuple(names),
                     unset=put.unset, args=put.args)


def _yaml_str(value: str) -> str:
    """`value` as --set writes it: quoted where YAML would read another type (`on` is true)."""
    import yaml

    return value if isinstance(yaml.safe_load(value), str) else json.dumps(value)


def parse_patch_spec(text: str, known: Mapping[str, PatchChoice], what: str) -> dict[str, str]:
    """`name[:variant],...` or `none` -> {name: variant} in registry order."""
    if text.strip().lower() == "none":
        return {}
    builtins = builtin_patches()
    out: dict[str, str] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, _, variant = item.partition(":")
        if name not in known:
            raise PatchError(f"{what}: unknown patch `{name}`", unknown_patch_hint(name, known))
        if name in out:
            raise PatchError(f"{what}: `{name}` is listed twice", "list each patch once")
        if name in builtins:
            found = builtins[name].variant(variant or None)
            if found is None:
                names = ", ".join(v.name for v in builtins[name].variants)
                raise PatchError(f"{what}: patch `{name}` has no variant `{variant}`",
                                 f"variants of {name}: {names}")
            out[name] = found.name
        elif variant and variant != "custom":
            raise PatchError(f"{what}: custom patch `{name}` has no variants", f"write `{name}`")
        else:
            out[name] = known[name].variant
    return {n: out[n] for n in known if n in out}


def resolve_question(profile: str, overrides: Overrides, good: str | None = None,
                     bad: str | None = None, candidates: str | None = None) -> Question:
    """The ends (default good: required patches on; default bad: the profile's patches with the
    overrides) and the candidates. Bad input raises `PatchError`/`BisectError`/`ConfigError`."""
    shaped = resolve(profile, overrides)  # the profile's patches with --set/--enable/--only
    known = {p.name: p for p in shaped.available}
    bad_set = parse_patch_spec(bad, known, "--bad") if bad is not None else shaped.patch_set
    if good is not None:
        good_set = parse_patch_spec(good, known, "--good")
    else:
        good_set = resolve(profile, good_overrides(shaped, overrides)).patch_set
    sets = base_sets(overrides.sets)
    ends = {end: resolve(profile, patch_overrides(p, sets))
            for end, p in (("good", good_set), ("bad", bad_set))}
    for end, cfg in ends.items():
        if cfg.cannot_start:
            raise ConfigError(f"the {end} end cannot start: {cfg.cannot_start}",
                              f"keep the required patch on at the {end} end")
    differ = [n for n in known if good_set.get(n) != bad_set.get(n)]
    if not differ:
        raise BisectError("the good and bad ends are the same configuration",
                          "give --good/--bad patch sets that differ (e.g. --good none)")
    inert = {n: _inert(n, ends) for n in differ}
    if candidates is not None:
        chosen = _chosen(candidates, known, differ)
    else:
        chosen = [n for n in differ if inert[n] is None]
        if not chosen:
            raise BisectError("every patch that differs between the ends is inert here",
                              "; ".join(f"{n}: {inert[n]}" for n in differ))
    left = tuple((n, f"inert: {inert[n]}" if inert[n] else "not in --candidates")
                 for n in differ if n not in chosen)
    bad_choices = {p.name: p for p in ends["bad"].patches}
    deliveries = {n: bad_choices[n].delivery for n in chosen if n in bad_choices}
    load_time = {n: bad_choices[n].load_time or "" for n in chosen
                 if n in bad_choices and bad_choices[n].load_time}
    return Question(profile, sets, good_set, bad_set, tuple(chosen), left,
                    {n: known[n].tier for n in chosen},
                    BisectSettings.model_construct(**shaped.bisect), deliveries,
                    load_time)


def _inert(name: str, ends: Mapping[str, EngineConfig]) -> str | None:
    """Why switching `name` cannot change anything here (from whichever end has it on)."""
    for cfg in (ends["bad"], ends["good"]):
        choice = next((p for p in cfg.patches if p.name == name), None)
        if choice is not None:
            return choice.inert
    return None


def _chosen(text: str, known: Mapping[str, PatchChoice], differ: list[str]) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    for name in names:
        if name not in known:
            raise PatchError(f"--candidates: unknown patch `{name}`",
                             unknown_patch_hint(name, known))
        if name not in differ:
            raise BisectError(f"--candidates: `{name}` is the same at the good and bad ends",
                              "candidates: " + ", ".join(differ))
    if not names:
        raise BisectError("--candidates is empty", "candidates: " + ", ".join(differ))
    return [n for n in differ if n in names]
